"""Database triggers that make a table append-only: UPDATE, DELETE and
TRUNCATE refused.

Used from migrations: a row trigger refuses UPDATE and DELETE, a statement
trigger refuses TRUNCATE.

The one privileged path (docs/howto/production.md): TRUNCATE goes through
when the session has set ``claimcheck.allow_truncate = 'on'`` AND the
current role holds the table owner's privileges. The setting alone proves
nothing (any role may set a custom setting), which is why ownership is
checked too; the application role neither owns the tables nor has the
TRUNCATE privilege, so only the owner role in a maintenance session (or the
test suite's flush between transactional tests) can empty these tables.
"""

from __future__ import annotations

from django.db import migrations

# The row trigger refuses UPDATE always, and DELETE except on the retention
# path (tickets/retention.py): inside ``claimcheck_prune_ledger``, a SECURITY
# DEFINER function owned by the owner role, which sets
# ``claimcheck.pruning = on`` for its own transaction. Both are checked: the
# setting (anyone may set it) and that the current role holds the table
# owner's privileges (inside the function current_user is its owner; the
# application role owns nothing), so the application role can delete only
# what that function's retention rule selects.
PG_FUNCTION = """
CREATE OR REPLACE FUNCTION claimcheck_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND pg_catalog.current_setting('claimcheck.pruning', true) = 'on'
       AND pg_catalog.pg_has_role(
           current_user,
           (SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID),
           'USAGE') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'append-only table %: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

# pg_catalog is spelled out: a session's temporary schema is searched before
# pg_catalog for relations, so an unqualified pg_class could be shadowed by a
# temporary table of the caller's.
PG_TRUNCATE_FUNCTION = """
CREATE OR REPLACE FUNCTION claimcheck_append_only_truncate() RETURNS trigger AS $$
BEGIN
    IF pg_catalog.current_setting('claimcheck.allow_truncate', true) = 'on'
       AND pg_catalog.pg_has_role(
           current_user,
           (SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID),
           'USAGE') THEN
        RETURN NULL;  -- a statement trigger's value is ignored: TRUNCATE proceeds
    END IF;
    RAISE EXCEPTION 'append-only table %: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'only the owner role, in a session with claimcheck.allow_truncate = on';
END;
$$ LANGUAGE plpgsql;
"""


def _pg_refuse_truncate(schema_editor, table: str) -> None:
    schema_editor.execute(PG_TRUNCATE_FUNCTION, params=None)
    # Dropped first so the operation can run again over a table that has it.
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};")
    schema_editor.execute(
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION claimcheck_append_only_truncate();"
    )


def _forward(tables):
    def run(apps, schema_editor):
        for table in tables:
            schema_editor.execute(PG_FUNCTION, params=None)
            schema_editor.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION claimcheck_append_only();"
            )
            _pg_refuse_truncate(schema_editor, table)

    return run


def _backward(tables):
    def run(apps, schema_editor):
        for table in tables:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};")

    return run


def AppendOnly(*tables: str) -> migrations.RunPython:  # noqa: N802 - reads like an operation
    """UPDATE, DELETE and TRUNCATE refused on these tables."""
    return migrations.RunPython(_forward(tables), _backward(tables))
