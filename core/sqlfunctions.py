"""The transition functions' source: one ``.sql`` file per PL/pgSQL function
in an app's ``sql/`` folder, named after the function, installed after every
``migrate``.

Why files and not migrations: each function is the one implementation of a
transition (admission, a turn's start and finish, the lock's release, a
delivery's opening), edited like code and reviewed as a diff of its own
file. A migration that replaced a body would carry a whole copy of it, and
two changes made side by side would each replace the other's. Tables,
columns and indexes stay in migrations; the functions follow the tables, so
they are installed once every migration of the plan has run.

A function whose installed body already matches its file (the file's digest
is kept as the function's comment) is left alone, so a ``migrate`` with
nothing new does not invalidate every session's cached plans. A changed
function is dropped and created in one transaction, with every overload of
its name, so a changed signature leaves no stale overload behind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

_INSTALLED = """
SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc')
FROM pg_proc p
WHERE p.proname = %s AND p.pronamespace = pg_catalog.current_schema()::regnamespace
"""


def digest(source: str) -> str:
    return "sha256:" + hashlib.sha256(source.encode()).hexdigest()


def sources(folder: Path) -> dict[str, str]:
    """Function name → its source, from ``folder/*.sql``."""
    return {path.stem: path.read_text() for path in sorted(folder.glob("*.sql"))}


def install(connection: BaseDatabaseWrapper, folder: Path) -> list[str]:
    """Create or replace every function of ``folder`` whose installed body
    differs from its file; the names of those (re)created."""
    changed = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cur:
        for name, source in sources(folder).items():
            want = digest(source)
            cur.execute(_INSTALLED, [name])
            installed = cur.fetchall()
            if len(installed) == 1 and installed[0][1] == want:
                continue
            for signature, _ in installed:
                cur.execute(f"DROP FUNCTION {signature}")
            cur.execute(source)
            cur.execute(_INSTALLED, [name])
            created = cur.fetchall()
            if len(created) != 1:
                raise RuntimeError(f"{folder / name}.sql must create exactly one function {name}")
            cur.execute(f"COMMENT ON FUNCTION {created[0][0]} IS %s", [want])
            changed.append(name)
    return changed


def installer(folder: Path):
    """A post_migrate receiver installing ``folder``'s functions for the app
    that sent it, once its models exist (not after a migration to zero, not
    after ``flush``, which sends post_migrate too)."""

    def install_after_migrate(sender, *, using: str, plan=None, apps=None, **kwargs) -> None:
        if plan is None:
            return
        if apps is not None:
            try:
                if not list(apps.get_app_config(sender.label).get_models()):
                    return
            except LookupError:
                return
        install(connections[using], folder)

    return install_after_migrate


@contextmanager
def call_cursor() -> Iterator[CursorWrapper]:
    """Django's cursor (its health check, execute wrappers, query log and
    error wrapping) binding its parameters on the server, for the calls of
    these functions. The call is parsed from its text with parameters
    typed, not from literals: less work for the server and for psycopg,
    which need not quote nineteen values into the text.

    By default nothing is prepared (the connection's ``prepare_threshold`` is
    never reached), so each call stays one unnamed statement, as PgBouncer
    before 1.21 in transaction mode needs. With ``DATABASE_PREPARED_CALLS``
    each call is a named prepared statement of its connection, planned once
    per server session (about 0.1 ms less a call: bench/README.md); only
    where a client connection keeps its server session or the pooler
    tracks prepared statements (docs/deploy.md)."""
    with connection.function_cursor(prepared=settings.DATABASE_PREPARED_CALLS) as cur:
        yield cur
