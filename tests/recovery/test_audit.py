"""The ledger audit (``manage.py audit_ledger``, recovery/audit.py).

A ledger written by real flows passes. Each invariant then gets one
violation and the command must fail naming it. The violations are written
with raw SQL as the database superuser: ONLY here, to fabricate corruption
that the services never write (that is the point of an audit). Everything
else in these tests goes through the services.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from health.models import SweepRun
from recovery.audit import audit_ledger
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.db_roles import owner_session
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketEvent, Turn


def run_audit(*args: str) -> tuple[int, str]:
    """(exit status, stdout) of ``manage.py audit_ledger``."""
    out = StringIO()
    try:
        call_command("audit_ledger", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + f"\n{exc}"
    return 0, out.getvalue()


def corrupt(sql: str, params: list | None = None) -> None:
    """Raw SQL as the superuser: fabricated corruption, never a service path."""
    with connection.cursor() as cur:
        cur.execute(sql, params or [])


def forge_transition(ticket_id: uuid.UUID, from_state: str, to_state: str) -> int:
    """A forged transition event (the ticket row is left as it is: the
    database refuses a forbidden change of it); the event's id."""
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor,
                   detail, at)
               VALUES (%s, 'forged', %s, %s, 'forged', '{}', now()) RETURNING id""",
            [ticket_id, from_state, to_state],
        )
        return cur.fetchone()[0]


def finish(ticket_id: uuid.UUID, outcome: Outcome | None = None) -> Turn:
    """Start the endpoint's next turn and finish it through the runtime."""
    started = runtime.start_turn(ticket_id=ticket_id)
    assert started is not None and started.ticket.id == ticket_id
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=outcome or Outcome.success({"done": str(ticket_id)}),
        source="test",
    )
    return Turn.objects.get(id=started.turn.id)


def admit(address: str, n: int = 0, **kw) -> Ticket:
    return admit_ticket(endpoint=address, input={"n": n}, actor="test", **kw).ticket


@pytest.fixture
def ledger(make_endpoint):
    """A small ledger written by the services: two finished turns on one
    endpoint, a failed one, a queued ticket just admitted."""
    make_endpoint("audit.a")
    make_endpoint("audit.b")
    t1, t2, t3 = admit("audit.a", 1), admit("audit.a", 2), admit("audit.b", 3)
    turn1, turn2 = finish(t1.id), finish(t2.id)
    turn3 = finish(t3.id, Outcome.failure({"code": "boom", "detail": "failed on purpose"}))
    queued = admit("audit.b", 4)
    return {"tickets": [t1, t2, t3, queued], "turns": [turn1, turn2, turn3]}


def names(out: str, kind: str, *ids) -> bool:
    lines = [line for line in out.splitlines() if line.startswith(kind + " ")]
    return any(all(str(i) in line for i in ids) for line in lines)


# --- Clean ledgers ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_ledger_written_by_the_services_passes(ledger, quarantine):
    quarantine("audit.stuck")  # a quarantined endpoint with its one open case
    status, out = run_audit()
    assert status == 0, out
    assert "clean" in out


@pytest.mark.django_db
def test_json_output_lists_each_violation_with_kind_and_ids(ledger):
    t1 = ledger["tickets"][0]
    forge_transition(t1.id, "succeeded", "failed")
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("audit_ledger", "--json", stdout=out)
    assert failed.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["ok"] is False
    assert report["counts"]["event_state_mismatch"] == 1
    [violation] = [v for v in report["violations"] if v["kind"] == "event_state_mismatch"]
    assert violation["ids"]["ticket"] == str(t1.id)
    assert "failed" in violation["detail"] and "succeeded" in violation["detail"]


@pytest.mark.django_db
def test_since_leaves_out_older_records(ledger):
    t1 = ledger["tickets"][0]
    forge_transition(t1.id, "succeeded", "failed")
    assert run_audit("--since", "1h")[0] == 1
    later = (timezone.now() + timedelta(minutes=5)).isoformat()
    status, out = run_audit("--since", later)
    assert status == 0, out


@pytest.mark.django_db
def test_a_bad_since_is_a_clear_error():
    with pytest.raises(CommandError, match="--since"):
        call_command("audit_ledger", "--since", "yesterday-ish")


# --- One violation per invariant ------------------------------------------------------------------


@pytest.mark.django_db
def test_overlapping_turns_of_one_endpoint_are_named(ledger):
    turn1, turn2, _ = ledger["turns"]
    # turn 2 starts before turn 1 ended (still after turn 1 started).
    corrupt(
        "UPDATE runtime_turn SET started_at = %s WHERE id = %s",
        [turn1.ended_at - timedelta(microseconds=500), turn2.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "turn_overlap", turn2.id, turn1.id), out
    assert "seq_order" not in out  # start order still matches seq


@pytest.mark.django_db
def test_a_long_turn_overlapping_a_later_one_is_seen(make_endpoint):
    make_endpoint("audit.long")
    tickets = [admit("audit.long", i) for i in range(3)]
    turns = [finish(t.id) for t in tickets]
    # Turn 1 now ends after turn 3 started: it overlaps both later turns.
    corrupt(
        "UPDATE runtime_turn SET ended_at = %s WHERE id = %s",
        [turns[2].started_at + timedelta(seconds=1), turns[0].id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "turn_overlap", turns[1].id, turns[0].id), out
    assert names(out, "turn_overlap", turns[2].id), out


@pytest.mark.django_db
def test_seq_out_of_start_order_is_named(ledger):
    turn1, turn2, _ = ledger["turns"]
    corrupt("UPDATE runtime_turn SET seq = 0 WHERE id = %s", [turn2.id])  # 1 then 0
    status, out = run_audit()
    assert status == 1
    assert names(out, "seq_order", turn2.id, turn1.id), out


@pytest.mark.django_db
def test_seq_above_the_endpoints_counter_is_named(ledger):
    _, turn2, _ = ledger["turns"]
    corrupt("UPDATE endpoints_endpoint SET turn_seq = 1 WHERE address = 'audit.a'")
    status, out = run_audit()
    assert status == 1
    assert names(out, "seq_order", turn2.id, "audit.a"), out


@pytest.mark.django_db
def test_a_result_from_another_tickets_turn_is_named(ledger):
    t1 = ledger["tickets"][0]
    _, turn2, _ = ledger["turns"]
    corrupt("UPDATE tickets_ticket SET turn_id = %s WHERE id = %s", [turn2.id, t1.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "foreign_result", t1.id, turn2.id), out


@pytest.mark.django_db
def test_a_result_on_a_ticket_that_did_not_succeed_is_named(ledger):
    t3 = ledger["tickets"][2]  # failed
    corrupt("""UPDATE tickets_ticket SET result = '{"invented": true}' WHERE id = %s""", [t3.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "foreign_result", t3.id), out


@pytest.mark.django_db
def test_a_callback_completion_attributed_to_a_non_callback_turn_is_named(make_endpoint):
    make_endpoint("audit.cb")
    parent, other = admit("audit.cb", 1), admit("audit.cb", 2)
    finish(parent.id)
    other_turn = finish(other.id)
    # As if a plain turn of another ticket had completed this one.
    corrupt(
        "UPDATE tickets_ticket SET completed_by_turn_id = %s WHERE id = %s",
        [other_turn.id, parent.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "foreign_result", parent.id, other_turn.id), out


def wait_on_approval(address: str, *, user, n: int = 0) -> tuple[Ticket, uuid.UUID]:
    """An agent-style exchange on ``address`` waiting on one call that needs
    an owner's approval, decided by ``user``: (the waiting ticket, the
    approval ticket's id). Through the runtime and the decision service."""
    from runtime.agents.services import decide_tool_call
    from runtime.runners import Wait

    waiting = admit(address, n)
    started = runtime.start_turn(ticket_id=waiting.id)
    continuation = {
        "ticket": str(waiting.id),
        "agent": {
            "exchange": str(waiting.id),
            "round": 1,
            "pending": {
                "call-1": {
                    "kind": "approval",
                    "tool": "send_report",
                    "args_sha256": "0" * 64,
                    "turn": str(started.turn.id),
                }
            },
        },
    }
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome("wait", wait=Wait(children=[], continuation=continuation)),
        source="test",
    )
    decided = decide_tool_call(
        address=address,
        ticket_id=str(waiting.id),
        call_id="call-1",
        approve=True,
        reason="ops asked for it",
        user=user,
    )
    return waiting, uuid.UUID(decided["approval_ticket"])


def resume(ticket_id: uuid.UUID, target: Ticket, **resumed) -> Turn:
    """Run ``ticket_id``'s turn to an outcome that resumes ``target``."""
    from runtime.runners import Resume

    resumed = resumed or {"result": {"done": str(target.id)}}
    own = {"resumed": str(target.id)}
    return finish(
        ticket_id,
        Outcome(
            "success", result=own, resume=Resume(ticket=str(target.id), own_result=own, **resumed)
        ),
    )


def wait_on_a_child(address: str, child_address: str, n: int = 0) -> tuple[Ticket, Ticket]:
    """A ticket on ``address`` waiting on one child on ``child_address``, the
    child finished: (the waiting ticket, the child's callback ticket)."""
    from runtime.runners import Child, Wait

    waiting = admit(address, n)
    finish(
        waiting.id,
        Outcome(
            "wait",
            wait=Wait(
                children=[Child(endpoint=child_address, input={"n": n})],
                continuation={"ticket": str(waiting.id)},
            ),
        ),
    )
    child = Ticket.objects.get(parent=waiting)
    finish(child.id)
    return waiting, Ticket.objects.get(callback_for=child)


@pytest.mark.django_db
def test_a_waiting_ticket_completed_by_its_approval_tickets_turn_passes(make_endpoint, staff_user):
    """docs/explanation/design.md "Who completes a waiting ticket": an owner's approval
    ticket's turn is one of the turns that may."""
    make_endpoint("audit.agent", owners=[staff_user.username])
    waiting, approval = wait_on_approval("audit.agent", user=staff_user)
    by = resume(approval, waiting)
    waiting.refresh_from_db()
    assert waiting.state == "succeeded" and waiting.completed_by_turn_id == by.id
    status, out = run_audit()
    assert status == 0, out


@pytest.mark.django_db
def test_a_waiting_ticket_completed_by_a_turn_that_does_not_answer_it_is_named(
    make_endpoint, staff_user
):
    """Each completion made by the runtime, then attributed to a turn that
    answers another waiting ticket: another's approval, another's callback."""
    make_endpoint("audit.agent", owners=[staff_user.username])
    make_endpoint("audit.child")
    by_approval, approval = wait_on_approval("audit.agent", user=staff_user, n=1)
    approval_turn = resume(approval, by_approval)
    by_callback, callback = wait_on_a_child("audit.agent", "audit.child", n=2)
    callback_turn = resume(callback.id, by_callback)
    assert run_audit()[0] == 0
    corrupt(
        "UPDATE tickets_ticket SET completed_by_turn_id = %s WHERE id = %s",
        [callback_turn.id, by_approval.id],
    )
    corrupt(
        "UPDATE tickets_ticket SET completed_by_turn_id = %s WHERE id = %s",
        [approval_turn.id, by_callback.id],
    )
    status, out = run_audit()
    assert status == 1
    for ticket, turn in ((by_approval, callback_turn), (by_callback, approval_turn)):
        assert names(out, "foreign_result", ticket.id, turn.id), out
        line = next(
            x for x in out.splitlines() if x.startswith("foreign_result") and str(turn.id) in x
        )
        assert "answers no call of this ticket" in line, line


@pytest.mark.django_db
def test_a_waiting_ticket_completed_by_a_turn_of_an_earlier_round_is_named(
    make_endpoint, staff_user
):
    """The first round's approval turn asked for a second round: only a turn
    after that may complete the exchange."""
    from runtime.agents.services import decide_tool_call
    from runtime.runners import Wait

    make_endpoint("audit.agent", owners=[staff_user.username])
    waiting, first = wait_on_approval("audit.agent", user=staff_user)
    pending = {"call-2": {"kind": "approval", "tool": "send_report", "args_sha256": "1" * 64}}
    again = Wait(
        children=[],
        continuation={
            "ticket": str(waiting.id),
            "agent": {"exchange": str(waiting.id), "round": 2, "pending": pending},
        },
    )
    first_turn = resume(first, waiting, wait=again)
    waiting.refresh_from_db()
    assert waiting.state == "waiting"
    second = decide_tool_call(
        address="audit.agent",
        ticket_id=str(waiting.id),
        call_id="call-2",
        approve=True,
        reason="again",
        user=staff_user,
    )
    resume(uuid.UUID(second["approval_ticket"]), waiting)
    assert run_audit()[0] == 0
    corrupt(
        "UPDATE tickets_ticket SET completed_by_turn_id = %s WHERE id = %s",
        [first_turn.id, waiting.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "foreign_result", waiting.id, first_turn.id), out
    assert "before the round" in out, out


@pytest.mark.django_db
def test_a_ticket_run_twice_is_named(ledger):
    t1 = ledger["tickets"][0]
    turn1, turn2, _ = ledger["turns"]
    # A second turn ran the same ticket (after turn 2, so the order holds).
    replay = uuid.uuid4()
    corrupt(
        """INSERT INTO runtime_turn (id, endpoint_id, ticket_id, seq, state, runner_kind,
               celery_task_id, worker, started_at, heartbeat_at, deadline_at,
               interrupt_reason, ended_at)
           SELECT %s, endpoint_id, ticket_id, 3, 'completed', runner_kind, '', '{}',
               %s, %s, %s, '', %s
           FROM runtime_turn WHERE id = %s""",
        [
            replay,
            turn2.ended_at + timedelta(seconds=1),
            turn2.ended_at + timedelta(seconds=1),
            turn2.ended_at + timedelta(seconds=60),
            turn2.ended_at + timedelta(seconds=2),
            turn1.id,
        ],
    )
    corrupt("UPDATE endpoints_endpoint SET turn_seq = 3 WHERE address = 'audit.a'")
    status, out = run_audit()
    assert status == 1
    assert names(out, "replayed_ticket", t1.id, turn1.id, replay), out


@pytest.mark.django_db
def test_a_second_turn_started_event_is_named(ledger):
    t1 = ledger["tickets"][0]
    corrupt(
        """INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor,
               detail, at)
           VALUES (%s, 'turn_started', 'queued', 'running', 'forged', '{}', now())""",
        [t1.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "replayed_ticket", t1.id), out
    assert names(out, "event_state_mismatch", t1.id), out  # and the chain breaks


@pytest.mark.django_db
def test_a_running_ticket_without_a_live_turn_or_case_is_named(make_endpoint):
    make_endpoint("audit.run")
    ticket = admit("audit.run")
    started = runtime.start_turn(ticket_id=ticket.id)
    assert run_audit()[0] == 0  # running with its live turn: fine
    corrupt(
        "UPDATE runtime_turn SET state = 'failed', ended_at = now() WHERE id = %s",
        [started.turn.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "running_without_turn", ticket.id, started.turn.id), out
    assert names(out, "lock_mismatch", started.turn.id), out  # the lock names an ended turn


@pytest.mark.django_db
def test_a_live_turn_that_does_not_hold_the_lock_is_named(make_endpoint):
    make_endpoint("audit.lock")
    ticket = admit("audit.lock")
    started = runtime.start_turn(ticket_id=ticket.id)
    corrupt(
        "UPDATE runtime_endpointlock SET holder_id = NULL, token = NULL WHERE endpoint_id = %s",
        [started.endpoint.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "lock_mismatch", started.turn.id, ticket.id), out


@pytest.mark.django_db
def test_a_recovering_ticket_without_an_open_case_is_named(quarantine):
    q = quarantine("audit.rec")
    corrupt("UPDATE recovery_recoverycase SET state = 'decided' WHERE id = %s", [q.case.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "recovering_without_case", q.ticket.id, q.turn.id), out
    # ... and the quarantined endpoint now has no open case.
    assert names(out, "quarantine_cases", "audit.rec"), out


@pytest.mark.django_db
def test_an_available_endpoint_with_an_open_case_is_named(quarantine):
    q = quarantine("audit.avail")
    # quarantine_case goes with the state (endpoint_case_when_quarantined):
    # what is left is the open case of an endpoint that takes work.
    corrupt(
        "UPDATE endpoints_endpoint SET state = 'available', quarantine_case = NULL WHERE id = %s",
        [q.endpoint.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "quarantine_cases", "audit.avail", q.case.id), out


@pytest.mark.django_db(transaction=True)  # the owner's DDL needs its own session
def test_two_callbacks_for_one_source_are_named(ledger):
    source, cb1, cb2 = ledger["tickets"][0], ledger["tickets"][1], ledger["tickets"][2]
    # The database's own guard (unique source) must go first: DDL, which only
    # the owner role may run. The audit runs on the same connection inside the
    # same transaction, which is rolled back: the constraint comes back.
    with owner_session(maintenance=False), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(
                """SELECT conname FROM pg_constraint
                   WHERE conrelid = 'tickets_callback'::regclass AND contype = 'u'
                     AND pg_get_constraintdef(oid) LIKE '%%(source_id)%%'"""
            )
            [(constraint,)] = cur.fetchall()
        corrupt(f'ALTER TABLE tickets_callback DROP CONSTRAINT "{constraint}"')
        for ticket in (cb1, cb2):
            corrupt(
                """INSERT INTO tickets_callback (source_id, target_id, ticket_id, created_at)
                   VALUES (%s, %s, %s, now())""",
                [source.id, ticket.endpoint_id, ticket.id],
            )
        status, out = run_audit()
        transaction.set_rollback(True)
    assert status == 1
    assert names(out, "duplicate_callback", source.id), out


@pytest.mark.django_db
def test_a_queued_ticket_with_no_message_owed_or_in_flight_is_named(make_endpoint, settings):
    settings.REDISPATCH_AFTER_S = 10
    make_endpoint("audit.q")
    fresh, old, owed = admit("audit.q", 1), admit("audit.q", 2), admit("audit.q", 3)
    hour_ago = timezone.now() - timedelta(hours=1)
    # Admitted an hour ago on a free endpoint that never ran a turn, and
    # unmarked (as the dispatcher unmarks what it publishes): its message is
    # long gone and nothing owes it one.
    corrupt(
        "UPDATE tickets_ticket SET created_at = %s, updated_at = %s WHERE id IN (%s, %s)",
        [hour_ago, hour_ago, old.id, owed.id],
    )
    corrupt("UPDATE tickets_ticket SET needs_dispatch = false WHERE id = %s", [old.id])
    corrupt("UPDATE tickets_ticket SET needs_dispatch = true WHERE id = %s", [owed.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "stranded_queued", old.id), out
    assert str(fresh.id) not in out  # just admitted: owed (marked)
    assert str(owed.id) not in out  # marked: the dispatcher or a release publishes it
    # With a window wider than its age, its admission counts as in flight.
    assert run_audit("--in-flight-s", "7200")[0] == 0


@pytest.mark.django_db
def test_a_queued_ticket_behind_a_recent_release_is_not_stranded(make_endpoint, settings):
    settings.REDISPATCH_AFTER_S = 10
    make_endpoint("audit.rel")
    first, waiting = admit("audit.rel", 1), admit("audit.rel", 2)
    hour_ago = timezone.now() - timedelta(hours=1)
    corrupt(
        "UPDATE tickets_ticket SET created_at = %s, updated_at = %s WHERE id = %s",
        [hour_ago, hour_ago, waiting.id],
    )
    finish(first.id)  # the release just now published the next ticket
    assert run_audit()[0] == 0
    corrupt("UPDATE runtime_turn SET ended_at = %s WHERE ticket_id = %s", [hour_ago, first.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "stranded_queued", waiting.id), out


@pytest.mark.django_db
def test_a_state_that_disagrees_with_the_last_event_is_named(ledger):
    t2 = ledger["tickets"][1]
    # The ticket row stays succeeded (the database refuses succeeded ->
    # cancelled, test_the_database_refuses_the_forbidden_edge_itself); a
    # forged event says it was cancelled.
    forge_transition(t2.id, "succeeded", "cancelled")
    status, out = run_audit()
    assert status == 1
    assert names(out, "event_state_mismatch", t2.id), out


@pytest.mark.django_db
def test_the_chain_starts_at_the_admission_the_ticket_row_implies(make_endpoint):
    """A ticket's admission event is implied by its row (no event row): the
    audit reads it as the chain's first link, whichever way it is written."""
    make_endpoint("audit.implied")
    implied, broken = admit("audit.implied", 1), admit("audit.implied", 2)
    assert not TicketEvent.objects.filter(ticket_id__in=[implied.id, broken.id]).exists()
    forged = forge_transition(broken.id, "running", "queued")  # after '' -> queued
    status, out = run_audit()
    assert status == 1
    assert names(out, "event_state_mismatch", broken.id, forged), out
    assert "the previous transition ended in queued" in out
    assert not names(out, "event_state_mismatch", implied.id), out
    assert "has no transition event" not in out


@pytest.mark.django_db
def test_an_event_recording_a_forbidden_edge_is_named(ledger):
    t1, t2 = ledger["tickets"][0], ledger["tickets"][1]
    # Its chain is unbroken and ends in the ticket's state; only the edge is
    # not one of the state machine's: succeeded -> running -> succeeded.
    forged = [forge_transition(t1.id, "succeeded", "running")]
    forged.append(forge_transition(t1.id, "running", "succeeded"))
    status, out = run_audit()
    assert status == 1
    assert names(out, "forbidden_edge", t1.id, forged[0]), out
    assert "succeeded -> running, an edge the ticket state machine does not have" in out
    assert not names(out, "forbidden_edge", forged[1]), out  # running -> succeeded is one
    assert not names(out, "event_state_mismatch", t1.id), out
    assert not names(out, "forbidden_edge", t2.id), out


@pytest.mark.django_db
def test_the_database_refuses_the_forbidden_edge_itself(ledger):
    t2 = ledger["tickets"][1]
    refused = pytest.raises(IntegrityError, match="no edge succeeded -> cancelled")
    with refused, transaction.atomic():
        corrupt("UPDATE tickets_ticket SET state = 'cancelled' WHERE id = %s", [t2.id])


@pytest.mark.django_db
def test_a_violation_count_past_the_limit_is_counted_not_listed(make_endpoint):
    make_endpoint("audit.many")
    tickets = [admit("audit.many", i) for i in range(5)]
    for t in tickets:  # an allowed edge, which the queued tickets never took
        forge_transition(t.id, "queued", "running")
    report = audit_ledger(limit=2)
    assert report.counts == {"event_state_mismatch": 5}
    assert len(report.violations) == 2


# --- After real flows (a real worker and beat) ---------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_ledger_after_real_flows_passes(worker, make_endpoint, api, owner):
    """Echo, failure, duplicates, children with callbacks, cancels of a queued
    and of a running ticket, a quarantine decided by its owner: the audit
    finds nothing."""
    from tests.conftest import wait_for

    make_endpoint("flow.echo")
    make_endpoint("flow.fail", path="runtime.demo.fail")
    make_endpoint("flow.research", path="runtime.demo.research")
    make_endpoint("flow.sleep", path="runtime.demo.sleep")
    make_endpoint(
        "flow.stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        turn_budget_s=1,
        interrupt_grace_s=0.5,
    )

    def post(endpoint, input, key=None):  # noqa: A002
        resp = api.post("/tickets", {"endpoint": endpoint, "input": input, "dedupe_key": key})
        assert resp.status_code in (200, 201), resp.content
        return resp.json()["id"]

    ids = [post("flow.echo", {"i": i}, f"echo-{i}") for i in range(4)]
    assert post("flow.echo", {"i": 0}, "echo-0") == ids[0]  # a duplicate finds it
    ids.append(post("flow.fail", {}))
    ids.append(post("flow.research", {"children": 3, "child_endpoint": "flow.echo"}, "research"))
    running = post("flow.sleep", {"seconds": 30})
    behind = post("flow.sleep", {"seconds": 30})
    # The budget is enforced by beat's sweeps: wait until they run (beat can
    # take many seconds to start on a loaded machine).
    wait_for(
        # (beat's routine "Sending due task" lines are DEBUG: the sweep's
        # own record of its run says it ran.)
        lambda: SweepRun.objects.filter(name="budgets").exists(),
        timeout=90,
        message="beat to send its first sweep",
    )
    stuck = post("flow.stuck", {"seconds": 8})
    wait_for(
        lambda: api.get(f"/tickets/{running}").json()["state"] == "running",
        timeout=30,
        message="the sleep turn to start",
    )
    assert api.post(f"/tickets/{behind}/cancel").json()["state"] == "cancelled"
    assert api.post(f"/tickets/{running}/cancel").status_code == 200
    ids += [running, behind, stuck]

    case = wait_for(
        lambda: api.get("/endpoints/flow.stuck").json()["open_case"],
        timeout=60,
        interval=0.2,
        message="the stuck turn to be quarantined",
    )
    inspection = api.post(f"/recovery/cases/{case}/inspections").json()["id"]
    decided = api.post(
        f"/recovery/cases/{case}/decisions",
        {"action": "finalize_orphan", "inspection": inspection, "rationale": "demo work"},
    )
    assert decided.status_code == 201, decided.content

    terminal = {"succeeded", "failed", "cancelled", "orphaned"}

    def all_terminal():
        states = {i: api.get(f"/tickets/{i}").json()["state"] for i in ids}
        return states if set(states.values()) <= terminal else None

    states = wait_for(all_terminal, timeout=60, interval=0.2, message="every ticket to finish")
    assert states[ids[5]] == "succeeded"  # research: completed by a callback's turn
    assert Ticket.objects.filter(callback_for__isnull=False).count() == 3
    assert states[running] == "cancelled" and states[stuck] == "orphaned"
    # Let the stuck turn's late result land too (it is recorded as evidence).
    wait_for(
        lambda: Ticket.objects.get(id=stuck).events.filter(kind="stale_outcome").exists(),
        timeout=30,
        message="the stuck turn's late result",
    )
    status, out = run_audit()
    assert status == 0, out


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_ledger_after_the_documented_agent_flows_passes(worker, make_endpoint, api):
    """demo.agent on a real worker, through the API as the README shows: a
    delegation resumed by a child's callback, an approval-requiring tool
    approved and another denied by an owner, each resumed by the approval
    ticket's turn. The audit accepts every completion."""
    from tests.conftest import wait_for

    make_endpoint("demo.echo")
    make_endpoint("demo.agent", runner={
        "kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"
    })  # fmt: skip

    def ask(prompt):
        resp = api.post("/tickets", {"endpoint": "demo.agent", "input": {"prompt": prompt}})
        assert resp.status_code == 201, resp.content
        return resp.json()["id"]

    def state(ticket):
        return api.get(f"/tickets/{ticket}").json()["state"]

    def settled(ticket):
        wait_for(
            lambda: state(ticket) in ("succeeded", "failed", "cancelled", "orphaned"),
            timeout=90,
            interval=0.2,
            message=f"ticket {ticket} to finish",
        )
        return api.get(f"/tickets/{ticket}").json()

    delegating, approved, denied = ask("delegate alpha, beta"), ask("send ops"), ask("send all")
    for ticket, decision in ((approved, True), (denied, False)):
        [call] = wait_for(
            lambda ticket=ticket: [
                c
                for c in api.get("/endpoints/demo.agent/approvals").json()
                if c["ticket"] == ticket
            ],
            timeout=90,
            interval=0.2,
            message="the call to wait for an owner",
        )
        decided = api.post(
            f"/endpoints/demo.agent/approvals/{ticket}/{call['call_id']}",
            {"approve": decision, "reason": "ops asked for it" if decision else "not to all"},
        )
        assert decided.status_code == 200, decided.content
    done = {ticket: settled(ticket) for ticket in (delegating, approved, denied)}
    assert done[delegating]["result"].startswith("children said: ok"), done[delegating]
    assert done[approved]["result"].startswith("done: send_report: sent to ops"), done[approved]
    assert "not to all" in done[denied]["result"], done[denied]
    for ticket in (approved, denied):
        by = Turn.objects.get(id=done[ticket]["completed_by_turn"])
        assert by.ticket.parent_id == uuid.UUID(ticket)  # the approval ticket's turn
        assert by.ticket.input["approval"]["ticket"] == ticket
    status, out = run_audit()
    assert status == 0, out


@pytest.mark.django_db
def test_a_result_discarded_as_timed_out_is_named(make_endpoint):
    """A success that returned after its interrupt is stopped (the ticket
    fails ``timed_out``, the event keeps the timing): clean. Moved so that it
    returned before the interrupt, the same ledger shows a result thrown away."""
    make_endpoint("audit.late", turn_budget_s=5, interrupt_grace_s=5)
    ticket = admit("audit.late")
    started = runtime.start_turn(ticket_id=ticket.id)
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="sweeper")
    turn = Turn.objects.get(id=started.turn.id)
    ran_s = (turn.interrupt_requested_at - turn.started_at).total_seconds() + 1
    done = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=Outcome.success({"late": True}),
        source="worker",
        ran_s=ran_s,
    )
    assert done.ticket_state == "failed"
    assert Ticket.objects.get(id=ticket.id).error["code"] == "timed_out"
    assert run_audit()[0] == 0
    corrupt(
        "UPDATE runtime_turn SET interrupt_requested_at = interrupt_requested_at"
        " + interval '2 seconds' WHERE id = %s",
        [turn.id],
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "discarded_result", ticket.id, turn.id), out


# --- Generations ------------------------------------------------------------------------------


@pytest.fixture
def changed(ledger):
    """audit.a at generation 2 (a change between its second turn and a third)."""
    from endpoints.services import update_endpoint

    update_endpoint(address="audit.a", changes={"turn_budget_s": 60}, reason="audit")
    third = finish(admit("audit.a", 5).id)
    assert third.generation == 2
    return {**ledger, "third": third}


@pytest.mark.django_db
def test_turns_under_two_generations_pass(changed):
    status, out = run_audit()
    assert status == 0, out


@pytest.mark.django_db
def test_a_turn_outside_its_generation_is_named(changed):
    third, first = changed["third"], changed["turns"][0]
    corrupt("UPDATE runtime_turn SET generation = 1 WHERE id = %s", [third.id])
    corrupt("UPDATE runtime_turn SET generation = 9 WHERE id = %s", [first.id])
    status, out = run_audit()
    assert status == 1
    assert names(out, "turn_generation", third.id, "outside generation 1"), out
    assert names(out, "turn_generation", first.id, "does not have"), out


@pytest.mark.django_db
def test_a_gap_in_generation_numbers_is_named(changed):
    corrupt(
        "INSERT INTO endpoints_endpointgeneration (endpoint_id, number, config, changes, actor,"
        " reason, first_seq, at) SELECT id, 4, '{}'::jsonb, '{}'::jsonb, '', '', turn_seq + 1,"
        " now() FROM endpoints_endpoint WHERE address = 'audit.a'"
    )
    status, out = run_audit()
    assert status == 1
    assert names(out, "generation_gap", "audit.a", "{1,2,4}"), out


@pytest.mark.django_db
def test_a_configuration_changed_outside_a_generation_is_named(changed):
    corrupt("UPDATE endpoints_endpoint SET turn_budget_s = 1 WHERE address = 'audit.b'")
    status, out = run_audit()
    assert status == 1
    assert names(out, "generation_drift", "audit.b"), out
