"""Database triggers that make a table append-only: UPDATE, DELETE and
TRUNCATE refused.

Used from migrations: a row trigger refuses UPDATE and DELETE, a statement
trigger refuses TRUNCATE. Their functions are files of core/sql/
(``claimcheck_append_only``, ``claimcheck_append_only_truncate``),
installed like every app's functions (core/sqlfunctions.py): here, before
a migration puts a trigger on a table, and after every ``migrate``, so a
changed body reaches an upgraded database as it reaches a fresh one.

The one privileged path (docs/howto/production.md): TRUNCATE goes through
when the session has set ``claimcheck.allow_truncate = 'on'`` AND the
current role holds the table owner's privileges. The setting alone proves
nothing (any role may set a custom setting), which is why ownership is
checked too; the application role neither owns the tables nor has the
TRUNCATE privilege, so only the owner role in a maintenance session (or the
test suite's flush between transactional tests) can empty these tables.
DELETE goes through only inside the retention function
(claimcheck_prune_ledger: core/sql/claimcheck_append_only.sql says how).
"""

from __future__ import annotations

from pathlib import Path

from django.db import migrations

from core import sqlfunctions

# The trigger functions' files.
FOLDER = Path(__file__).resolve().parent / "sql"


def _forward(tables):
    def run(apps, schema_editor):
        sqlfunctions.install(schema_editor.connection, FOLDER)
        for table in tables:
            # Dropped first so the operation can run again over a table that has them.
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
            schema_editor.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION claimcheck_append_only();"
            )
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};")
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION claimcheck_append_only_truncate();"
            )

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
