"""The two-role setup (docs/howto/production.md) on real PostgreSQL: the
application role that web and workers connect as may read and write rows and
nothing more, so it cannot empty, rewrite, unprotect or drop the append-only
ledger; the owner role cannot empty it either outside a maintenance session;
and the application's own flows run as the application role."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from core.append_only import AppendOnly
from core.db_roles import grant_app_role
from health.models import SweepRun
from tests.conftest import ROOT, wait_for
from tests.db_roles import OWNER, connect, owner_session, two_roles
from tickets.models import Ticket

APPEND_ONLY = [
    "tickets_ticketevent",
    "tickets_deliveryattempt",
    "recovery_inspection",
    "recovery_decision",
    "recovery_lesson",
    "recovery_caseevidence",
]
REFUSED_BY_TRIGGER = "append-only table .*: TRUNCATE refused"


@pytest.fixture
def app_role(django_db_setup) -> str:
    if not two_roles():
        pytest.skip("one database role: set DATABASE_APP_ROLE (`make test` does)")
    return settings.DATABASE_APP_ROLE


@pytest.fixture
def as_app(app_role):
    with connect(owner=False) as conn:
        yield conn


@pytest.fixture
def as_owner(app_role):
    with connect(owner=True) as conn:
        yield conn


def one(conn: psycopg.Connection, sql: str, params=()):
    return conn.execute(sql, params).fetchone()[0]


# --- The application role -------------------------------------------------------------------


def test_the_application_role_owns_nothing_and_has_no_powers(as_app, app_role):
    assert one(as_app, "SELECT current_user") == app_role
    attrs = as_app.execute(
        "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication"
        " FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert attrs == (False, False, False, False, False)
    assert one(as_app, "SELECT count(*) FROM pg_class WHERE relowner = current_user::regrole") == 0
    assert one(as_app, "SELECT pg_has_role(current_user, %s, 'MEMBER')", [OWNER["USER"]]) is False
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_app.execute("CREATE TABLE roles_probe (id int)")


def test_the_application_role_reads_and_writes_rows_of_ordinary_tables(as_app):
    for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
        assert one(as_app, "SELECT has_table_privilege('tickets_ticket', %s)", [privilege])
    # Nowhere TRUNCATE, REFERENCES or TRIGGER (TRIGGER would let it add triggers).
    granted = as_app.execute(
        "SELECT c.relname, p FROM pg_class c"
        " CROSS JOIN unnest(ARRAY['TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p"
        " WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace"
        " AND has_table_privilege(c.oid, p)"
    ).fetchall()
    assert granted == []
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
        as_app.execute("ALTER TABLE tickets_ticket DISABLE TRIGGER ALL")


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_the_application_role_may_only_read_and_append_to_an_append_only_table(as_app, table):
    as_app.execute(f"SELECT count(*) FROM {table}")  # it may read
    assert one(as_app, "SELECT has_table_privilege(%s, 'INSERT')", [table])
    # The maintenance setting is the owner's path; it does nothing for this role.
    as_app.execute("SET claimcheck.allow_truncate = on")
    for statement in (
        f"TRUNCATE {table}",
        f"UPDATE {table} SET id = id",
        f"DELETE FROM {table}",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            as_app.execute(statement)
    for statement in (
        f"ALTER TABLE {table} DISABLE TRIGGER ALL",
        f"ALTER TABLE {table} DISABLE TRIGGER {table}_no_truncate",
        f"DROP TRIGGER {table}_append_only ON {table}",
        f"DROP TABLE {table}",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
            as_app.execute(statement)


def test_the_in_process_code_under_test_runs_as_the_application_role(app_role, db):
    with connection.cursor() as cur:
        cur.execute("SELECT current_user, session_user")
        assert cur.fetchone() == (app_role, app_role)


# --- TRUNCATE and the owner's maintenance session ---------------------------------------


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_the_owner_cannot_truncate_an_append_only_table_outside_maintenance(as_owner, table):
    # CASCADE: a referenced table (inspections) is otherwise refused by its
    # foreign keys before any trigger is asked.
    with (
        pytest.raises(
            psycopg.errors.InsufficientPrivilege, match=f"append-only table {table}: TRUNCATE"
        ),
        as_owner.transaction(force_rollback=True),
    ):
        as_owner.execute(f"TRUNCATE {table} CASCADE")


def test_a_cascade_from_the_tickets_reaches_the_trigger_too(as_owner):
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match=REFUSED_BY_TRIGGER),
        as_owner.transaction(force_rollback=True),
    ):
        as_owner.execute("TRUNCATE tickets_ticket CASCADE")


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_the_owner_in_a_maintenance_session_may_truncate(as_owner, table):
    with as_owner.transaction(force_rollback=True):  # prove the path, keep the rows
        as_owner.execute("SET LOCAL claimcheck.allow_truncate = on")
        as_owner.execute(f"TRUNCATE {table} CASCADE")


def test_a_role_granted_truncate_is_still_refused_unless_it_owns_the_table(
    as_owner, as_app, app_role
):
    as_owner.execute(f"GRANT TRUNCATE ON tickets_ticketevent TO {app_role}")
    try:
        as_app.execute("SET claimcheck.allow_truncate = on")
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege, match=REFUSED_BY_TRIGGER),
            as_app.transaction(force_rollback=True),
        ):
            as_app.execute("TRUNCATE tickets_ticketevent")
    finally:
        as_owner.execute(f"REVOKE TRUNCATE ON tickets_ticketevent FROM {app_role}")


def test_every_append_only_table_refuses_truncate_and_withholds_changes(as_owner, app_role):
    """Found from the catalog, so a table made append-only later (another
    app's AppendOnly migration) is held to the same rules."""
    rows = as_owner.execute(
        "SELECT c.relname,"
        " EXISTS (SELECT 1 FROM pg_trigger t2 WHERE t2.tgrelid = c.oid"
        "   AND t2.tgfoid = 'claimcheck_append_only_truncate'::regproc),"
        " has_table_privilege(%s, c.oid, 'UPDATE, DELETE, TRUNCATE')"
        " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " WHERE t.tgfoid = 'claimcheck_append_only'::regproc ORDER BY 1",
        [app_role],
    ).fetchall()
    assert {name for name, _, _ in rows} >= set(APPEND_ONLY)
    assert [(name, True, False) for name, _, _ in rows] == rows


def test_a_table_made_append_only_later_refuses_truncate_and_gets_grants(
    transactional_db, as_owner, app_role
):
    """AppendOnly itself adds the TRUNCATE trigger; tables the owner creates
    later reach the application role through default privileges, and the
    grants after migrate take the changes away from an append-only one."""
    operation = AppendOnly("roles_probe")
    try:
        with owner_session(maintenance=False) as conn:
            with conn.schema_editor() as editor:
                editor.execute("CREATE TABLE roles_probe (id bigint PRIMARY KEY)")
            has = "SELECT has_table_privilege(%s, 'roles_probe', %s)"
            # Default privileges: the new table is the application's to use...
            assert one(as_owner, has, [app_role, "UPDATE"]) is True
            with conn.schema_editor() as editor:
                operation.code(None, editor)
            assert "roles_probe" in grant_app_role(connection=conn, role=app_role)
        # ...until the grants after migrate see it is append-only.
        assert one(as_owner, has, [app_role, "SELECT"]) is True
        assert one(as_owner, has, [app_role, "INSERT"]) is True
        for privilege in ("UPDATE", "DELETE", "TRUNCATE"):
            assert one(as_owner, has, [app_role, privilege]) is False, privilege
        as_owner.execute("INSERT INTO roles_probe VALUES (1)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=REFUSED_BY_TRIGGER):
            as_owner.execute("TRUNCATE roles_probe")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            as_owner.execute("DELETE FROM roles_probe")
    finally:
        as_owner.execute("DROP TABLE IF EXISTS roles_probe")


def test_migrate_connects_with_database_migrate_url_and_grants_database_url_user(
    transactional_db, as_owner, app_role
):
    """Production: DATABASE_URL is the application role, DATABASE_MIGRATE_URL
    the owner. A privilege taken away comes back only if `migrate` ran its
    grants as the owner, for DATABASE_URL's user."""
    db = connection.settings_dict
    url = f"postgres://{{}}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    as_owner.execute(f"REVOKE SELECT ON tickets_ticket FROM {app_role}")
    try:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_APP_ROLE"}
        env.update(
            DATABASE_URL=url.format(app_role),
            DATABASE_MIGRATE_URL=url.format(OWNER["USER"]),
            PYTHONPATH=str(ROOT),
        )
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=120,
        )
        assert one(
            as_owner, "SELECT has_table_privilege(%s, 'tickets_ticket', 'SELECT')", [app_role]
        )
    finally:
        as_owner.execute(f"GRANT SELECT ON tickets_ticket TO {app_role}")


# --- The application's flows, as the application role ---------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_admission_and_a_turn_in_the_real_worker_run_as_the_application_role(
    app_role, worker, make_endpoint, api
):
    make_endpoint("roles.whoami", path="tests.whoami.whoami")
    response = api.post(
        "/tickets", {"endpoint": "roles.whoami", "input": {}, "dedupe_key": "roles-1"}
    )
    assert response.status_code == 201, response.content
    ticket_id = response.json()["id"]
    ticket = wait_for(
        lambda: Ticket.objects.filter(id=ticket_id, state="succeeded").first(),
        timeout=30,
        message="the turn to finish in the worker",
    )
    assert ticket.result == {"current_user": app_role, "session_user": app_role}
    # Beat's sweeps ran in the worker as well, as the application role.
    # (beat is not waited for at start; under load it takes a while to come
    # up. A sweep records its run: routine sweeps say nothing at INFO.)
    wait_for(
        lambda: SweepRun.objects.filter(name="budgets").exists(), timeout=90, message="a sweep"
    )
    for name in ("turns", "beat"):
        assert b"permission denied" not in worker.log(name), worker.log(name)[-2000:]
