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
nothing new does not invalidate every session's cached plans.

Rolling upgrades (docs/howto/upgrade.md): ``migrate`` of a release runs
while the previous release's web and workers keep calling these functions.
So a changed body replaces the old one in place (``CREATE OR REPLACE``: the
callers of the same signature go on, and each session re-plans), but a
changed signature -- arguments, their names (callers use named notation),
or the result's columns -- is refused here: such a function gets a new
versioned name (``claimcheck_admit_v2.sql``), the release calls the new
name, and the old function stays for the old release until the post-deploy
step (``manage.py post_deploy``) drops what the folder's ``RETIRED`` file
lists, once no process of the old release runs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
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


class SignatureChanged(RuntimeError):
    """A function's file changed what its callers rely on: it needs a new name."""


def _signature_changed(path: Path, name: str, detail: str) -> SignatureChanged:
    return SignatureChanged(
        f"{path}: {detail}. The running release still calls {name} as it was: give the "
        f"changed function a new versioned name ({name}_v2.sql, called by the new release) "
        f"and list the old signature in {path.parent / RETIRED} for `manage.py post_deploy` "
        "(docs/howto/upgrade.md)"
    )


# The file naming the functions a post-deploy step drops: one
# ``name(argument types)`` a line, as ``regprocedure`` prints it.
RETIRED = "RETIRED"


def install(connection: BaseDatabaseWrapper, folder: Path) -> list[str]:
    """Create every function of ``folder`` that is missing, and replace in
    place every one whose body differs from its file; the names of those
    written. A file that would change a function's signature or result
    raises ``SignatureChanged`` and writes nothing."""
    from psycopg import errors

    changed = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cur:
        pending = list(sources(folder).items())
        # A LANGUAGE sql function's body is checked when it is created: one
        # that calls a function whose file sorts after its own waits for
        # that one's round (a call of a function no file creates still fails).
        while pending:
            waiting: list[tuple[str, str]] = []
            failed: DatabaseError | None = None
            for name, source in pending:
                try:
                    if _install_one(connection, cur, folder, name, source):
                        changed.append(name)
                except DatabaseError as exc:
                    if not isinstance(exc.__cause__, errors.UndefinedFunction):
                        raise
                    waiting.append((name, source))
                    failed = exc
            if failed is not None and len(waiting) == len(pending):
                raise failed
            pending = waiting
    return changed


def _install_one(
    connection: BaseDatabaseWrapper, cur: CursorWrapper, folder: Path, name: str, source: str
) -> bool:
    """Install one file's function unless its body is installed already;
    whether it was written."""
    from psycopg import errors

    path = folder / f"{name}.sql"
    want = digest(source)
    cur.execute(_INSTALLED, [name])
    installed = cur.fetchall()
    if len(installed) == 1 and installed[0][1] == want:
        return False
    if len(installed) > 1:
        raise RuntimeError(f"{name} has {len(installed)} overloads; expected one")
    try:
        with transaction.atomic(using=connection.alias):
            cur.execute(source)
    except DatabaseError as exc:
        cause = exc.__cause__
        if isinstance(cause, errors.InvalidFunctionDefinition):  # result or names
            raise _signature_changed(path, name, str(cause).splitlines()[0]) from exc
        raise
    cur.execute(_INSTALLED, [name])
    created = cur.fetchall()
    if len(created) != 1:
        if installed:  # CREATE OR REPLACE with other arguments made an overload
            raise _signature_changed(
                path, name, f"its arguments changed (installed: {installed[0][0]})"
            )
        raise RuntimeError(f"{path} must create exactly one function {name}")
    cur.execute(f"COMMENT ON FUNCTION {created[0][0]} IS %s", [want])
    return True


def retired(folder: Path) -> list[str]:
    """The signatures ``folder``'s RETIRED file lists (comments with #)."""
    path = folder / RETIRED
    if not path.exists():
        return []
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def drop_retired(connection: BaseDatabaseWrapper, folder: Path) -> list[str]:
    """The post-deploy step: drop the functions ``folder``'s RETIRED file
    lists (those still installed); the signatures dropped. Run it once no
    process of the previous release runs: they may still call them."""
    dropped = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cur:
        for signature in retired(folder):
            name = signature.split("(", 1)[0]
            if name in sources(folder):
                raise RuntimeError(f"{folder / RETIRED} retires {name}, which a file still defines")
            cur.execute("SELECT to_regprocedure(%s) IS NOT NULL", [signature])
            if cur.fetchone()[0]:
                cur.execute(f"DROP FUNCTION {signature}")
                dropped.append(signature)
    return dropped


# Every registered folder: (the app whose tables its functions read, or
# None for functions that read none, folder).
_FOLDERS: list[tuple[str | None, Path]] = []


def installer(folder: Path, label: str | None = None, *, tables: bool = True):
    """A post_migrate receiver installing the functions of every registered
    folder (this one included) once their app's models exist (not after a
    migration to zero, not after ``flush``, which sends post_migrate too).
    ``tables=False``: the folder's functions read no app's tables
    (core/sql/, the append-only triggers' functions), so they are
    installed after every migrate.

    All folders in one transaction, at the first app's post_migrate: a
    function of one folder may call a function of another (the finish calls
    the ledger's rules), and a release's running workers must never see the
    caller replaced before its callee exists. Later apps' post_migrate find
    nothing left to do."""
    if not tables:
        label = None
    elif label is None:
        label = folder.parent.name
    if (label, folder) not in _FOLDERS:
        _FOLDERS.append((label, folder))

    def install_after_migrate(sender, *, using: str, plan=None, apps=None, **kwargs) -> None:
        if plan is None:
            return
        ready = []
        for app_label, app_folder in _FOLDERS:
            if apps is not None and app_label is not None:
                try:
                    if not list(apps.get_app_config(app_label).get_models()):
                        continue
                except LookupError:
                    continue
            ready.append(app_folder)
        connection = connections[using]
        with transaction.atomic(using=using):
            for app_folder in ready:
                install(connection, app_folder)

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
    per server session (no planning on each call); only
    where a client connection keeps its server session or the pooler
    tracks prepared statements (docs/howto/pgbouncer.md)."""
    with connection.function_cursor(prepared=settings.DATABASE_PREPARED_CALLS) as cur:
        yield cur
