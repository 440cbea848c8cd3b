"""The two-role setup (docs/howto/production.md).

Migrations run as the owner role, which owns every table; web and workers
connect as the application role, which owns nothing. After every `migrate`
the application role gets exactly what the code needs: SELECT, INSERT,
UPDATE and DELETE on tables and USAGE, SELECT and UPDATE on sequences, and
on the append-only tables only SELECT and INSERT (their triggers refuse the
rest anyway; the privileges refuse it first). It cannot TRUNCATE, run DDL,
disable a trigger or drop anything: all of those need ownership.
"""

from __future__ import annotations

import re

import environ
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from core.embedded import unquote_host

_ROLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")

# Every table that carries core/append_only.py's row trigger: tables made
# append-only by later migrations are found without a list to keep up to date.
_APPEND_ONLY_TABLES = """
SELECT DISTINCT c.relname
  FROM pg_catalog.pg_trigger t
  JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
  JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
 WHERE p.proname = 'claimcheck_append_only'
   AND c.relnamespace = pg_catalog.current_schema()::regnamespace
 ORDER BY c.relname
"""


def grant_app_role(*, connection: BaseDatabaseWrapper, role: str) -> list[str]:
    """Grant ``role`` what web and workers need on the current schema, for
    tables that exist and (default privileges) for tables the connected role
    creates later. Idempotent. Returns the append-only tables it covered."""
    if not _ROLE_NAME.match(role):
        raise ImproperlyConfigured(f"DATABASE_APP_ROLE {role!r} is not a plain role name")
    quote = connection.ops.quote_name
    r = quote(role)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_catalog.current_schema()")
        s = quote(cur.fetchone()[0])
        cur.execute(_APPEND_ONLY_TABLES)
        append_only = [row[0] for row in cur.fetchall()]
        statements = [
            f"GRANT USAGE ON SCHEMA {s} TO {r}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
            f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
            # Tables and sequences the migrating role creates from now on.
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {r}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} "
            f"GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {r}",
            # The application reads which migrations ran; it never records one.
            f"REVOKE INSERT, UPDATE, DELETE ON {s}.django_migrations FROM {r}",
        ]
        if append_only:
            tables = ", ".join(f"{s}.{quote(t)}" for t in append_only)
            statements.append(f"REVOKE UPDATE, DELETE, TRUNCATE ON {tables} FROM {r}")
        # Retention's one privileged path (tickets/retention.py): EXECUTE on
        # the owner's SECURITY DEFINER function, which deletes only what
        # the retention rule selects.
        cur.execute(
            "SELECT pg_catalog.to_regprocedure("
            "'claimcheck_prune_ledger(timestamptz, integer, boolean, integer)') IS NOT NULL"
        )
        if cur.fetchone()[0]:
            statements.append(
                "GRANT EXECUTE ON FUNCTION "
                f"{s}.claimcheck_prune_ledger(timestamptz, integer, boolean, integer) TO {r}"
            )
        for statement in statements:
            cur.execute(statement)
    return append_only


def grant_after_migrate(sender, *, using: str, plan=None, **kwargs) -> None:
    """post_migrate: re-grant after every migrate, so new tables, a changed
    DATABASE_APP_ROLE or a newly append-only table are covered."""
    if plan is None:
        return  # `flush` sends post_migrate too; it changes rows, not privileges
    role = settings.DATABASE_APP_ROLE
    connection = connections[using]
    if not role:
        return  # one role: nothing to grant
    with connection.cursor() as cur:
        cur.execute("SELECT current_user")
        if cur.fetchone()[0] == role:
            return  # migrating as the application role itself: one-role setup
    grant_app_role(connection=connection, role=role)


def connect_as(connection: BaseDatabaseWrapper, url: str) -> None:
    """Point this thread's ``connection`` at ``url`` (another role), keeping
    its options. The next query opens a new connection."""
    parsed = unquote_host(environ.Env.db_url_config(url))
    connection.close()
    connection.settings_dict = {
        **connection.settings_dict,
        **{k: parsed[k] for k in ("NAME", "USER", "PASSWORD", "HOST", "PORT") if k in parsed},
    }
