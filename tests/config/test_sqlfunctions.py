"""The transition functions' files (``<app>/sql/*.sql``) are what the
database runs: installed after migrate, left alone when unchanged, replaced
whole (every overload) when their file changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from core import sqlfunctions
from tests.db_roles import owner_session

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = [ROOT / "tickets" / "sql", ROOT / "runtime" / "sql"]


def _installed(name: str) -> list[tuple[str, str | None]]:
    with connection.cursor() as cur:
        cur.execute(sqlfunctions._INSTALLED, [name])
        return cur.fetchall()


def test_every_file_is_the_installed_function():
    names = []
    for folder in FOLDERS:
        for name, source in sqlfunctions.sources(folder).items():
            names.append(name)
            assert _installed(name) == [(_installed(name)[0][0], sqlfunctions.digest(source))], (
                f"{name} in the database is not {folder.name}/{name}.sql"
            )
    assert {
        "claimcheck_admit",
        "claimcheck_open_delivery",
        "claimcheck_start_turn",
        "claimcheck_finish_turn",
        "claimcheck_release_lock",
        "claimcheck_next_ticket",
    } <= set(names)


def test_migrate_with_nothing_new_leaves_them_alone():
    for folder in FOLDERS:
        assert sqlfunctions.install(connection, folder) == []


def _fn(body: str, args: str = "p integer") -> str:
    return (
        f"CREATE OR REPLACE FUNCTION claimcheck_probe({args}) RETURNS integer\n"
        f"LANGUAGE sql AS $$ SELECT {body} $$;\n"
    )


def _call(conn, sql: str) -> int:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


@pytest.fixture
def owner():
    """The migrating role's connection (the functions' owner), and no probe
    left behind."""
    with owner_session(maintenance=False) as conn:
        try:
            yield conn
        finally:
            with conn.cursor() as cur:
                cur.execute(sqlfunctions._INSTALLED, ["claimcheck_probe"])
                for signature, _ in cur.fetchall():
                    cur.execute(f"DROP FUNCTION {signature}")


@pytest.mark.django_db(transaction=True)
def test_a_changed_file_replaces_the_function_and_its_overloads(owner, tmp_path):
    probe = tmp_path / "claimcheck_probe.sql"
    probe.write_text(_fn("p + 1"))
    assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe"]
    assert _call(owner, "SELECT claimcheck_probe(1)") == 2
    assert sqlfunctions.install(owner, tmp_path) == []

    # A new body and a new signature: the old overload goes with it.
    probe.write_text(_fn("p + q", "p integer, q integer"))
    assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe"]
    assert _call(owner, "SELECT claimcheck_probe(1, 5)") == 6
    with owner.cursor() as cur:
        cur.execute(sqlfunctions._INSTALLED, ["claimcheck_probe"])
        assert [sig for sig, _ in cur.fetchall()] == ["claimcheck_probe(integer,integer)"]


@pytest.mark.django_db(transaction=True)
def test_a_file_must_create_the_function_it_is_named_after(owner, tmp_path):
    (tmp_path / "claimcheck_other.sql").write_text(_fn("1"))
    with pytest.raises(RuntimeError, match="must create exactly one function"):
        sqlfunctions.install(owner, tmp_path)
    with owner.cursor() as cur:  # the transaction rolled back: nothing created
        cur.execute(sqlfunctions._INSTALLED, ["claimcheck_probe"])
        assert cur.fetchall() == []


def _prepared(text: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
            [f"%{text}%"],
        )
        return [row[0] for row in cur.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_a_prepared_call_runs_the_function_a_migrate_replaced(settings):
    """A worker holding the call prepared while ``migrate`` replaces the
    function (dropped and created, as ``install`` does: a new oid) runs the
    new body on its next call: PostgreSQL re-plans the prepared statement."""
    from tests.db_roles import connect

    settings.DATABASE_PREPARED_CALLS = True

    def call() -> int:
        with sqlfunctions.call_cursor() as cur:
            cur.execute("SELECT claimcheck_probe(%s)", [1])
            return cur.fetchone()[0]

    with connect(owner=True) as owner:
        try:
            owner.execute(_fn("p + 1"))
            assert call() == 2
            assert _prepared("claimcheck_probe(") != []
            owner.execute("DROP FUNCTION claimcheck_probe(integer)")
            owner.execute(_fn("p + 10"))
            assert call() == 11
        finally:
            owner.execute("DROP FUNCTION IF EXISTS claimcheck_probe(integer)")
