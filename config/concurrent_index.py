"""Index changes for migrations of the ledger's tables, built without a
lock on its writes: ``CONCURRENTLY`` (the migration must be non-atomic).

An interrupted ``CREATE INDEX CONCURRENTLY`` leaves an ``INVALID`` index of
that name, which PostgreSQL keeps up to date on every write but never reads;
``IF NOT EXISTS`` alone would keep it. ``create`` drops such a leftover and
builds the index again, so running the migration again repairs it."""

from __future__ import annotations


def create(schema_editor, name: str, on: str) -> None:
    """``CREATE INDEX name ON <on>``; ``on`` is the table, its columns and
    any predicate, e.g. ``tickets_ticket (parent_id) WHERE parent_id IS NOT NULL``."""
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name]
        )
        row = cur.fetchone()
    if row and row[0]:
        drop(schema_editor, name)
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {on}")


def drop(schema_editor, name: str) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def rebuild(schema_editor, name: str, on: str) -> None:
    """Build ``name`` again as ``on``, the new index in place before the old
    one goes (no moment without one)."""
    drop(schema_editor, f"{name}_next")  # a leftover of an interrupted run
    create(schema_editor, f"{name}_next", on)
    drop(schema_editor, name)
    schema_editor.execute(f"ALTER INDEX {name}_next RENAME TO {name}")
