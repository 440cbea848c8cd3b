"""Retention (tickets/retention.py, `manage.py prune_ledger`) against real
PostgreSQL, as the application role. Old work is made by running the real
flows with the clock turned back (django.utils.timezone.now), never by
writing a state or a timestamp by hand."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from io import StringIO
from unittest import mock

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from recovery import services as recovery
from recovery.models import CaseEvidence, Decision, Inspection, Lesson, RecoveryCase
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import ROOT
from tests.recovery.conftest import drive_to_quarantine, owner  # noqa: F401 - fixture
from tickets import delivery, retention
from tickets.admission import admit_ticket
from tickets.models import Delivery, LedgerEvent, RetentionHold, Ticket, Trace

pytestmark = pytest.mark.django_db(transaction=True)

REAL_NOW = timezone.now


@contextlib.contextmanager
def days_ago(days: float):
    """Run the real flows with the clock turned back ``days``."""
    shift = timedelta(days=days)
    with mock.patch("django.utils.timezone.now", lambda: REAL_NOW() - shift):
        yield


def run(endpoint: str, **admit) -> Ticket:
    admitted = admit_ticket(endpoint=endpoint, input={"n": 1}, actor="test", **admit)
    runtime.run_ticket(ticket_id=admitted.ticket.id)
    return Ticket.objects.get(id=admitted.ticket.id)


def exists(ticket: Ticket) -> bool:
    return Ticket.objects.filter(id=ticket.id).exists()


@pytest.fixture
def ledger(make_endpoint, owner):  # noqa: F811 - the imported fixture
    make_endpoint("ret.echo")
    make_endpoint(
        "ret.stuck", path="runtime.demo.stuck", interrupt_grace_s=0.05, owners=[owner.username]
    )
    with days_ago(40):
        done = run("ret.echo")  # finished, delivered (acknowledged): prunable
        delivery.acknowledge(ticket_id=done.id, actor="test")
        owed = run("ret.echo")  # finished, obligation still open: kept
        # A case: quarantined, then decided and closed with a lesson: kept,
        # with its evidence, inspection, decision and lesson.
        stuck = admit_ticket(endpoint="ret.stuck", input={"seconds": 30}, actor="test")
        q = drive_to_quarantine(stuck.ticket.id)
        runtime.finish_turn(
            turn_id=q.turn.id, seq=q.turn.seq, outcome=Outcome.success({"late": 1}), source="worker"
        )
        inspection = recovery.inspect_case(case_id=q.case.id, user=owner)
        recovery.decide(
            case_id=q.case.id,
            user=owner,
            action="finalize_orphan",
            inspection_id=inspection.id,
            rationale="r",
        )
        recovery.write_lesson(
            case_id=q.case.id, user=owner, what_failed="a", evidence="b", prevention="c"
        )
        # An open case (its ticket recovering): kept.
        open_case = drive_to_quarantine(
            admit_ticket(
                endpoint=make_endpoint(
                    "ret.stuck2", path="runtime.demo.stuck", interrupt_grace_s=0.05
                ).address,
                input={"seconds": 30},
                actor="test",
            ).ticket.id
        )
    # The turn functions stamp finished_at with the database's clock, which
    # no mock turns back: age what the block above finished, as 40 days would.
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE tickets_ticket SET finished_at = finished_at - interval '40 days'"
            " WHERE id = ANY(%s) AND finished_at IS NOT NULL",
            [[done.id, owed.id, q.ticket.id, open_case.ticket.id]],
        )
    recent = run("ret.echo")  # finished today: kept
    delivery.acknowledge(ticket_id=recent.id, actor="test")
    return {
        "done": done,
        "owed": owed,
        "case": q,
        "open_case": open_case,
        "recent": recent,
    }


def recovery_rows() -> dict[str, int]:
    return {
        m.__name__: m.objects.count()
        for m in (RecoveryCase, CaseEvidence, Inspection, Decision, Lesson)
    }


def test_prune_deletes_only_old_settled_traces(ledger):
    done, owed, case, open_case, recent = (
        ledger["done"],
        ledger["owed"],
        ledger["case"],
        ledger["open_case"],
        ledger["recent"],
    )
    before = recovery_rows()
    assert before["Lesson"] == 1 and before["RecoveryCase"] == 2
    # A dry run counts and deletes nothing.
    dry = retention.prune(older_than_days=30, dry_run=True, keep_history=1)
    assert dry.counts["traces"] == 1 and dry.counts["tickets"] == 1, dry
    assert exists(done)
    report = retention.prune(older_than_days=30, batch=1, keep_history=1)
    assert report.counts == dry.counts, (report, dry)
    assert not exists(done)
    assert not LedgerEvent.objects.filter(ticket_id=done.id).exists()
    assert not Delivery.objects.filter(ticket_id=done.id).exists()
    assert not Trace.objects.filter(id=done.trace_id).exists()
    for kept in (owed, case.ticket, open_case.ticket, recent):
        assert exists(kept), kept
        assert LedgerEvent.objects.filter(ticket_id=kept.id).exists()
    assert recovery_rows() == before
    # Nothing more to do: a second run deletes nothing.
    again = retention.prune(older_than_days=30, keep_history=1)
    assert again.counts["tickets"] == 0


def test_the_prune_keeps_what_an_owner_holds_in_the_ledger(ledger):
    """The prune reads only the ledger's tables: recovery's cases hold their
    tickets in it (a trigger on recovery's tables), and any hold keeps its
    ticket's trace until it goes."""
    case, open_case, done = ledger["case"], ledger["open_case"], ledger["done"]
    held = set(RetentionHold.objects.values_list("ticket_id", "held_by"))
    assert (case.ticket.id, f"recovery case {case.case.id}") in held
    assert (open_case.ticket.id, f"recovery case {open_case.case.id}") in held

    hold = RetentionHold.objects.create(ticket=done, held_by="test", since=timezone.now())
    assert retention.prune(older_than_days=30, keep_history=1).counts["tickets"] == 0
    assert exists(done)
    hold.delete()
    assert retention.prune(older_than_days=30, keep_history=1).counts["tickets"] == 1
    assert not exists(done) and exists(case.ticket) and exists(open_case.ticket)


def test_the_holds_of_records_made_before_the_trigger_are_made_with_it(ledger, owner_cursor):
    """Installing recovery's trigger (its file, after a migrate that changed
    it) also holds what the cases and decisions made before it point at,
    and holds nothing twice."""
    before = set(RetentionHold.objects.values_list("ticket_id", "held_by"))
    assert before
    RetentionHold.objects.all().delete()
    source = (ROOT / "recovery" / "sql" / "claimcheck_recovery_hold.sql").read_text()
    owner_cursor.execute(source)
    owner_cursor.execute(source)
    assert set(RetentionHold.objects.values_list("ticket_id", "held_by")) == before
    assert RetentionHold.objects.count() == len(before)


def test_a_trace_an_admission_is_joining_is_skipped_and_kept(ledger):
    """An admission joining an old, prunable trace holds the trace's row
    until it commits: a prune meanwhile neither waits for it nor deletes the
    trace, and once the new ticket is in, the trace is no longer prunable."""
    done = ledger["done"]
    joined: dict[str, uuid.UUID] = {}
    holding, release = threading.Event(), threading.Event()

    def join_the_trace():
        try:
            with transaction.atomic():
                admitted = admit_ticket(
                    endpoint="ret.echo", input={"n": 2}, trace_id=done.trace_id, actor="test"
                )
                joined["id"] = admitted.ticket.id
                holding.set()
                assert release.wait(30)
        finally:
            connection.close()

    joiner = threading.Thread(target=join_the_trace)
    joiner.start()
    try:
        assert holding.wait(30), "the admission did not start"
        pruned: dict[str, retention.PruneReport] = {}

        def prune():
            try:
                pruned["report"] = retention.prune(older_than_days=30, batch=10, keep_history=1)
            finally:
                connection.close()

        pruner = threading.Thread(target=prune)
        pruner.start()
        pruner.join(20)
        assert not pruner.is_alive(), "the prune waited for the admission's trace"
        assert pruned["report"].counts["traces"] == 0, pruned["report"]
    finally:
        release.set()
        joiner.join(30)
    assert exists(done)
    assert Ticket.objects.filter(id=joined["id"], trace_id=done.trace_id).exists()
    again = retention.prune(older_than_days=30, keep_history=1)
    assert again.counts["traces"] == 0 and exists(done)


def test_the_latest_history_of_an_endpoint_is_kept(ledger):
    # ret.echo's 20 latest context entries include the old "done" ticket's.
    report = retention.prune(older_than_days=30)
    assert report.counts["tickets"] == 0 and exists(ledger["done"])


def test_the_app_role_cannot_delete_append_only_rows_itself(ledger):
    with connection.cursor() as cur:
        cur.execute("SELECT current_user")
        role = cur.fetchone()[0]
    from django.conf import settings

    if settings.DATABASE_APP_ROLE and role != settings.DATABASE_APP_ROLE:
        pytest.fail(f"the test should run as the application role, not {role}")
    done = ledger["done"]
    for sql in (
        "SET claimcheck.pruning = 'on'; DELETE FROM tickets_ticketevent WHERE ticket_id = %s",
        "SET claimcheck.allow_truncate = 'on'; TRUNCATE tickets_ticketevent CASCADE",
    ):
        with (
            pytest.raises(Exception, match="append-only|permission denied"),  # noqa: B017
            connection.cursor() as cur,
        ):
            cur.execute(sql, [done.id] if "%s" in sql else None)
    assert LedgerEvent.objects.filter(ticket_id=done.id).exists()
    # The function refuses a recent cutoff (it re-checks the rule itself).
    with (
        connection.cursor() as cur,
        pytest.raises(Exception, match="at least one day ago"),  # noqa: B017
    ):
        cur.execute("SELECT * FROM claimcheck_prune_ledger(now(), 10, false, 20)")


def test_the_triggers_stay_enabled_and_refuse_the_owner_outside_the_function(ledger, owner_cursor):
    retention.prune(older_than_days=30, keep_history=1)
    owner_cursor.execute(
        "SELECT c.relname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE t.tgname LIKE '%%append_only'"
    )
    states = dict(owner_cursor.fetchall())
    assert states["tickets_ticketevent"] == "O" and states["recovery_caseevidence"] == "O"
    owner_cursor.execute("SET claimcheck.pruning = 'off'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute(
            "DELETE FROM tickets_ticketevent WHERE ticket_id = %s", [ledger["owed"].id]
        )


def settled_long_ago(count: int) -> list[Ticket]:
    """``count`` more prunable traces on ret.echo, as the fixture's "done"."""
    with days_ago(40):
        tickets = [run("ret.echo") for _ in range(count)]
        for ticket in tickets:
            delivery.acknowledge(ticket_id=ticket.id, actor="test")
    with connection.cursor() as cur:  # as the fixture ages its finished work
        cur.execute(
            "UPDATE tickets_ticket SET finished_at = finished_at - interval '40 days'"
            " WHERE id = ANY(%s)",
            [[t.id for t in tickets]],
        )
    return tickets


def test_a_stop_or_a_budget_ends_the_prune_after_its_batch_and_a_pause_follows_each(ledger):
    # Three prunable traces with the fixture's "done" (the newest of these is
    # ret.echo's latest history, kept).
    settled_long_ago(3)
    stop = threading.Event()
    stop.set()
    # Asked to stop before it starts: one batch, then no pause however long.
    stopped = retention.prune(
        older_than_days=30, batch=1, keep_history=1, pause_ratio=10, stop=stop
    )
    assert (stopped.batches, stopped.counts["traces"], stopped.complete) == (1, 1, False)
    assert stopped.paused_s == 0
    # A budget already spent: one batch.
    budget = retention.prune(older_than_days=30, batch=1, keep_history=1, max_s=0)
    assert (budget.batches, budget.counts["traces"], budget.complete) == (1, 1, False)
    # The rest, pausing half of each batch after it: the last batch finds
    # nothing and ends the run without a pause.
    rest = retention.prune(older_than_days=30, batch=1, keep_history=1, pause_ratio=0.5)
    assert (rest.batches, rest.counts["traces"], rest.complete) == (2, 1, True)
    assert rest.paused_s == pytest.approx(0.5 * rest.batch_s[0])
    assert not exists(ledger["done"]) and exists(ledger["owed"])
    with pytest.raises(ValueError, match="pause-ratio"):
        retention.prune(older_than_days=30, pause_ratio=11)
    with pytest.raises(ValueError, match="max-seconds"):
        retention.prune(older_than_days=30, max_s=-1)


def test_a_pause_ratio_out_of_range_is_refused_when_the_settings_load(tmp_path):
    env = {**os.environ, "RETENTION_PAUSE_RATIO": "11", "CLAIMCHECK_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "RETENTION_PAUSE_RATIO must be between 0 and 10" in done.stderr, done.stderr


def test_the_command_reports_and_needs_a_cutoff(ledger, settings):
    out = StringIO()
    call_command("prune_ledger", "--older-than", "30", "--dry-run", stdout=out)
    assert "would delete" in out.getvalue()
    assert exists(ledger["done"])
    settings.RETENTION_DAYS = 0
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="older-than"):
        call_command("prune_ledger")
    with pytest.raises(CommandError, match="at least 1 day"):
        call_command("prune_ledger", "--older-than", "0.5")
    with pytest.raises(CommandError, match="pause-ratio"):
        call_command("prune_ledger", "--older-than", "30", "--pause-ratio", "-1")
    out = StringIO()
    call_command(
        "prune_ledger", "--older-than", "30", "--pause-ratio", "0.5", "--max-seconds", "60",
        stdout=out,
    )  # fmt: skip
    assert "deleted" in out.getvalue() and "paused" in out.getvalue(), out.getvalue()
    assert uuid.UUID(str(ledger["done"].id))


def test_a_trace_with_its_row_and_a_root_alone_go_in_one_prune(ledger):
    """A root alone has no trace row (admission writes one when a second
    ticket joins): the prune finds it by its ticket, and a trace with a row
    by the row, under one rule, in one pass."""
    with days_ago(40):
        root = run("ret.echo")
        child = run("ret.echo", parent_id=root.id)
        delivery.acknowledge(ticket_id=root.id, actor="test")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE tickets_ticket SET finished_at = finished_at - interval '40 days'"
            " WHERE id = ANY(%s)",
            [[root.id, child.id]],
        )
    # The endpoint's latest history is today's again (kept: keep_history).
    later = run("ret.echo")
    delivery.acknowledge(ticket_id=later.id, actor="test")
    assert Trace.objects.filter(id=root.trace_id).exists()  # the child started it
    assert not Trace.objects.filter(id=ledger["done"].trace_id).exists()  # alone
    report = retention.prune(older_than_days=30, keep_history=1)
    assert (report.counts["traces"], report.counts["tickets"]) == (2, 3), report
    assert not exists(root) and not exists(child) and not exists(ledger["done"])
    assert not Trace.objects.filter(id=root.trace_id).exists()
    assert exists(ledger["owed"]) and exists(ledger["recent"])
