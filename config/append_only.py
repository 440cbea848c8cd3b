"""Database triggers that make a table append-only (UPDATE and DELETE refused).

Used from migrations; works on PostgreSQL and SQLite so the embedded default
keeps the same guarantee.
"""

from __future__ import annotations

from django.db import migrations

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION claimcheck_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'append-only table %: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def _forward(tables):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        for table in tables:
            if vendor == "postgresql":
                schema_editor.execute(PG_FUNCTION, params=None)
                schema_editor.execute(
                    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                    f"FOR EACH ROW EXECUTE FUNCTION claimcheck_append_only();"
                )
                # TRUNCATE is left to the privilege system (the application's
                # role should not own the tables); the test suite's flush
                # between transactional tests relies on it.
            elif vendor == "sqlite":
                for op in ("UPDATE", "DELETE"):
                    schema_editor.execute(
                        f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                        f"BEGIN SELECT RAISE(ABORT, 'append-only table {table}: {op} refused'); "
                        "END;"
                    )
            else:  # pragma: no cover - only the two supported backends
                raise RuntimeError(f"append-only triggers not written for {vendor}")

    return run


def _backward(tables):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        for table in tables:
            if vendor == "postgresql":
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
            else:
                for op in ("update", "delete"):
                    schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_{op};")

    return run


def AppendOnly(*tables: str) -> migrations.RunPython:  # noqa: N802 - reads like an operation
    return migrations.RunPython(_forward(tables), _backward(tables))
