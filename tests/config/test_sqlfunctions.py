"""The transition functions' files (``<app>/sql/*.sql``) are what the
database runs: installed after migrate, left alone when unchanged, replaced
in place when their body changes; a changed signature is refused (it needs
a versioned name, the old function retired by ``post_deploy``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import DatabaseError, connection

from core import sqlfunctions
from tests.db_roles import owner_session

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = [ROOT / "core" / "sql", ROOT / "tickets" / "sql", ROOT / "recovery" / "sql"]


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
        "claimcheck_admit_v2",
        "claimcheck_open_delivery",
        "claimcheck_start_turn",
        "claimcheck_finish_turn",
        "claimcheck_release_lock",
        "claimcheck_next_ticket",
        "claimcheck_prune_keeps",
        "claimcheck_recovery_hold",
        "claimcheck_append_only",
        "claimcheck_append_only_truncate",
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
def test_a_changed_body_replaces_the_function_in_place(owner, tmp_path):
    """CREATE OR REPLACE: the same function (oid), so the previous release's
    callers, which may hold it prepared, go on with the new body."""
    probe = tmp_path / "claimcheck_probe.sql"
    probe.write_text(_fn("p + 1"))
    assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe"]
    assert _call(owner, "SELECT claimcheck_probe(p => 1)") == 2
    oid = _call(owner, "SELECT 'claimcheck_probe(integer)'::regprocedure::oid")
    assert sqlfunctions.install(owner, tmp_path) == []

    probe.write_text(_fn("p + 2"))
    assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe"]
    assert _call(owner, "SELECT claimcheck_probe(p => 1)") == 3
    assert _call(owner, "SELECT 'claimcheck_probe(integer)'::regprocedure::oid") == oid


@pytest.mark.parametrize(
    "changed, why",
    [
        (_fn("p + q", "p integer, q integer"), "its arguments changed"),
        (_fn("x", "x integer"), "cannot change name of input parameter"),
        (
            "CREATE OR REPLACE FUNCTION claimcheck_probe(p integer) RETURNS text\n"
            "LANGUAGE sql AS $$ SELECT p::text $$;\n",
            "cannot change return type",
        ),
    ],
    ids=["arguments", "argument-names", "result"],
)
@pytest.mark.django_db(transaction=True)
def test_a_changed_signature_in_place_is_refused(owner, tmp_path, changed, why):
    """What the previous release calls must not change under it during a
    rolling upgrade: a new signature needs a new versioned name. Nothing is
    written, and the installed function still answers its callers."""
    probe = tmp_path / "claimcheck_probe.sql"
    probe.write_text(_fn("p + 1"))
    sqlfunctions.install(owner, tmp_path)
    probe.write_text(changed)
    with pytest.raises(sqlfunctions.SignatureChanged, match=why) as refused:
        sqlfunctions.install(owner, tmp_path)
    assert "claimcheck_probe_v2.sql" in str(refused.value)
    assert _call(owner, "SELECT claimcheck_probe(p => 1)") == 2
    with owner.cursor() as cur:
        cur.execute(sqlfunctions._INSTALLED, ["claimcheck_probe"])
        assert [sig for sig, _ in cur.fetchall()] == ["claimcheck_probe(integer)"]


@pytest.mark.django_db(transaction=True)
def test_a_versioned_successor_keeps_the_old_function_until_post_deploy(owner, tmp_path):
    """The new release adds claimcheck_probe_v2 beside the old function
    (which the old release still calls) and retires the old one; only the
    post-deploy step drops it."""
    (tmp_path / "claimcheck_probe.sql").write_text(_fn("p + 1"))
    sqlfunctions.install(owner, tmp_path)

    (tmp_path / "claimcheck_probe.sql").unlink()
    (tmp_path / "claimcheck_probe_v2.sql").write_text(
        _fn("p + q", "p integer, q integer").replace("claimcheck_probe(", "claimcheck_probe_v2(")
    )
    (tmp_path / sqlfunctions.RETIRED).write_text(
        "# kept for the previous release until post_deploy\nclaimcheck_probe(integer)\n"
    )
    assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe_v2"]
    assert _call(owner, "SELECT claimcheck_probe(p => 1)") == 2  # the old release's call
    assert _call(owner, "SELECT claimcheck_probe_v2(p => 1, q => 5)") == 6

    assert sqlfunctions.drop_retired(owner, tmp_path) == ["claimcheck_probe(integer)"]
    assert sqlfunctions.drop_retired(owner, tmp_path) == []  # idempotent
    with owner.cursor() as cur:
        cur.execute(sqlfunctions._INSTALLED, ["claimcheck_probe"])
        assert cur.fetchall() == []
        cur.execute("DROP FUNCTION claimcheck_probe_v2(integer, integer)")


def test_the_release_retires_nothing_it_still_defines():
    for folder in FOLDERS:
        assert not set(s.split("(")[0] for s in sqlfunctions.retired(folder)) & set(
            sqlfunctions.sources(folder)
        )


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


@pytest.mark.django_db(transaction=True)
def test_the_first_post_migrate_installs_every_folder_in_one_transaction(
    owner, tmp_path, monkeypatch
):
    """A function of one app's folder calls another's (the finish calls the
    ledger's rules): a running release must never see the caller replaced
    before its callee exists, so the folders are installed together, or
    not at all."""
    first, second = tmp_path / "first" / "sql", tmp_path / "second" / "sql"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "claimcheck_probe.sql").write_text(
        "CREATE OR REPLACE FUNCTION claimcheck_probe(p integer) RETURNS integer\n"
        "LANGUAGE plpgsql AS $$ BEGIN RETURN claimcheck_probe_v2(p => p); END $$;\n"
    )
    (second / "claimcheck_probe_v2.sql").write_text("SELECT 1;\n")  # creates nothing
    monkeypatch.setattr(sqlfunctions, "_FOLDERS", [])
    receiver = sqlfunctions.installer(first, label="first")
    sqlfunctions.installer(second, label="second")
    with pytest.raises(RuntimeError, match="must create exactly one function"):
        receiver(sender=None, using="default", plan=[], apps=None)
    assert _installed("claimcheck_probe") == []  # the first folder's undone too

    (second / "claimcheck_probe_v2.sql").write_text(
        _fn("p * 10").replace("claimcheck_probe(", "claimcheck_probe_v2(")
    )
    receiver(sender=None, using="default", plan=[], apps=None)
    try:
        assert _call(owner, "SELECT claimcheck_probe(p => 2)") == 20
    finally:
        with owner.cursor() as cur:
            cur.execute("DROP FUNCTION claimcheck_probe_v2(integer)")


@pytest.mark.django_db(transaction=True)
def test_a_sql_function_may_call_one_whose_file_sorts_after_its_own(owner, tmp_path):
    """A LANGUAGE sql body is checked when it is created: the caller waits
    for its callee's round (claimcheck_admit_existing calls
    claimcheck_ticket_visible). A callee no file creates still fails."""
    (tmp_path / "claimcheck_probe.sql").write_text(_fn("claimcheck_probe_z(q => p)"))
    (tmp_path / "claimcheck_probe_z.sql").write_text(
        _fn("q * 3", "q integer").replace("claimcheck_probe(", "claimcheck_probe_z(")
    )
    try:
        assert sqlfunctions.install(owner, tmp_path) == ["claimcheck_probe_z", "claimcheck_probe"]
        assert _call(owner, "SELECT claimcheck_probe(p => 2)") == 6
    finally:
        with owner.cursor() as cur:
            cur.execute("DROP FUNCTION IF EXISTS claimcheck_probe(integer)")
            cur.execute("DROP FUNCTION IF EXISTS claimcheck_probe_z(integer)")
    (tmp_path / "claimcheck_probe_z.sql").unlink()
    with pytest.raises(DatabaseError, match="claimcheck_probe_z"):
        sqlfunctions.install(owner, tmp_path)
