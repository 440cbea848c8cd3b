"""config.concurrent_index: the ledger's index migrations run again over an
interrupted CREATE INDEX CONCURRENTLY and repair it. Run as the owner role
(the application role may not create tables), on its autocommit connection
(CONCURRENTLY refuses a transaction block)."""

from __future__ import annotations

import contextlib

import psycopg
import pytest

from config import concurrent_index

pytestmark = pytest.mark.django_db(transaction=True)


class _Editor:
    """What the helpers use of a schema editor, over the owner's cursor."""

    vendor = "postgresql"

    def __init__(self, cur) -> None:
        self.cur = cur
        self.connection = self

    @contextlib.contextmanager
    def cursor(self):
        yield self.cur

    def execute(self, sql: str) -> None:
        self.cur.execute(sql)


def _valid(cur, name: str) -> bool | None:
    cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
    row = cur.fetchone()
    return None if row is None else row[0]


@pytest.fixture
def editor(owner_cursor):
    owner_cursor.execute("CREATE TABLE ci_scratch (a int)")
    owner_cursor.execute("INSERT INTO ci_scratch VALUES (1), (1), (2)")
    yield _Editor(owner_cursor)
    owner_cursor.execute("DROP TABLE ci_scratch")


def test_an_invalid_leftover_is_built_again(editor):
    # A build that failed half-way (here: duplicates under UNIQUE) leaves
    # an INVALID index under the name: IF NOT EXISTS alone would keep it.
    with pytest.raises(psycopg.errors.UniqueViolation):
        editor.execute("CREATE UNIQUE INDEX CONCURRENTLY ci_scratch_a ON ci_scratch (a)")
    assert _valid(editor.cur, "ci_scratch_a") is False
    concurrent_index.create(editor, "ci_scratch_a", "ci_scratch (a)")
    assert _valid(editor.cur, "ci_scratch_a") is True


def test_a_rebuild_swaps_in_the_new_definition_under_the_same_name(editor):
    concurrent_index.create(editor, "ci_scratch_a", "ci_scratch (a)")
    concurrent_index.rebuild(editor, "ci_scratch_a", "ci_scratch (a) WHERE a > 1")
    concurrent_index.rebuild(editor, "ci_scratch_a", "ci_scratch (a) WHERE a > 1")  # again
    editor.cur.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'ci_scratch'")
    (definition,) = [row[0] for row in editor.cur.fetchall()]
    assert definition.endswith("WHERE (a > 1)") and " ci_scratch_a " in definition
    assert _valid(editor.cur, "ci_scratch_a") is True
