"""Recovery services on real quarantined cases: inspection, every decision,
lessons, the owner rule, late evidence and the race between two owners."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from django.db import connections

from core.errors import (
    CircuitOpen,
    EndpointQuarantined,
    Invalid,
    InvalidTransition,
    NotFound,
)
from recovery import services
from recovery.models import CaseEvidence, Decision, Inspection, Lesson
from runtime import turns as runtime
from runtime.runners import Outcome
from tickets.admission import admit_ticket
from tickets.models import ContextEntry, EndpointLock, LedgerEvent, Ticket, TicketEvent, Trace

from .conftest import drive_to_quarantine, dump_ledger

pytestmark = pytest.mark.django_db


def decide(q, user, action, inspection=None, rationale="because", evidence=""):
    inspection = inspection or services.inspect_case(case_id=q.case.id, user=user)
    return services.decide(
        case_id=q.case.id,
        user=user,
        action=action,
        inspection_id=inspection.id,
        rationale=rationale,
        evidence=evidence,
    )


def events(ticket_id):
    return list(LedgerEvent.objects.filter(ticket_id=ticket_id).order_by("id"))


def last_event(ticket_id, kind):
    """The latest event of one kind (other issues' hooks, such as delivery,
    may append their own events around ours)."""
    return LedgerEvent.objects.filter(ticket_id=ticket_id, kind=kind).latest("id")


# --- Quarantine (the starting point) -------------------------------------------------------


def test_quarantine_fixture_gives_a_real_open_case(quarantine):
    q = quarantine()
    assert q.case.state == "open"
    assert q.endpoint.state == "quarantined"
    assert q.ticket.state == "recovering"
    assert q.turn.state == "uncertain"
    assert EndpointLock.objects.get(endpoint=q.endpoint).holder_id == q.turn.id
    with pytest.raises(EndpointQuarantined) as refused:
        admit_ticket(endpoint=q.endpoint.address, input={})
    assert refused.value.extra["case"] == str(q.case.id)


# --- Inspection -----------------------------------------------------------------------------


def test_inspection_snapshot_holds_ticket_turn_lock_callbacks_outputs_events_evidence(
    quarantine, owner
):
    q = quarantine(dedupe_key="snap-1")
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    stored = Inspection.objects.get(id=inspection.id)
    snap = stored.snapshot
    assert {"ticket", "turn", "lock", "callbacks", "outputs", "events", "evidence"} <= set(snap)
    assert snap["ticket"]["id"] == str(q.ticket.id)
    assert snap["ticket"]["state"] == "recovering"
    assert snap["ticket"]["dedupe_key"] == "snap-1"
    turn = snap["turn"]
    assert turn["id"] == str(q.turn.id) and turn["seq"] == q.turn.seq == 1
    assert turn["state"] == "uncertain"
    assert turn["stop_evidence"] is None
    assert turn["worker"] == q.turn.worker and turn["worker"]["pid"]
    assert turn["interrupt_reason"] == "deadline"
    assert snap["lock"] == {
        "holder_turn": str(q.turn.id),
        "held_by_uncertain_turn": True,
        "token": q.turn.seq,
        "acquired_at": snap["lock"]["acquired_at"],
    }
    assert snap["lock"]["acquired_at"]
    assert snap["callbacks"] == []
    assert snap["outputs"] == {
        "result": None,
        "error": None,
        "artifacts": [],
        "context_entries": [],
    }
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds == [
        "admitted",
        "turn_started",
        "interrupt_requested",
        "turn_uncertain",
        "endpoint_quarantined",
    ]
    assert snap["evidence"]["items"] == []
    assert snap["evidence"]["late_stop_receipt"] is False
    assert snap["evidence"]["late_result"] is False
    # The digest is over the canonical JSON of what was stored, so anyone can
    # recompute it from the row.
    canonical = json.dumps(snap, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert stored.sha256 == hashlib.sha256(canonical.encode()).hexdigest()
    assert stored.actor == owner


def test_inspection_changes_nothing_else(quarantine, owner):
    q = quarantine()
    before = dump_ledger()
    inspections_before = Inspection.objects.count()
    services.inspect_case(case_id=q.case.id, user=owner)
    services.inspect_case(case_id=q.case.id, user=owner)
    assert Inspection.objects.count() == inspections_before + 2
    assert dump_ledger() == before


def test_two_inspections_of_an_unchanged_case_have_the_same_digest(quarantine, owner):
    q = quarantine()
    a = services.inspect_case(case_id=q.case.id, user=owner)
    b = services.inspect_case(case_id=q.case.id, user=owner)
    assert a.id != b.id
    assert a.sha256 == b.sha256


def test_only_owners_and_staff_may_inspect(quarantine, owner, outsider, staff_user):
    q = quarantine()
    with pytest.raises(NotFound):  # a case only its owners (and staff) see
        services.inspect_case(case_id=q.case.id, user=outsider)
    assert Inspection.objects.count() == 0
    assert services.inspect_case(case_id=q.case.id, user=staff_user).actor == staff_user


def test_unknown_or_malformed_case_is_not_found(owner):
    for bad in ("nope", "01930000-0000-7000-8000-000000000000", None):
        with pytest.raises(NotFound):
            services.inspect_case(case_id=bad, user=owner)


# --- Late evidence --------------------------------------------------------------------------


def test_late_result_is_case_evidence_applied_to_nothing(quarantine, owner):
    q = quarantine()
    first = services.inspect_case(case_id=q.case.id, user=owner)
    finished = runtime.finish_turn(
        turn_id=q.turn.id,
        seq=q.turn.seq,
        outcome=Outcome.success({"answer": 42}),
        source="worker",
    )
    assert finished.accepted is False
    evidence = CaseEvidence.objects.get(case=q.case)
    assert evidence.kind == "late_success" and evidence.seq == q.turn.seq
    assert evidence.detail["result"] == {"answer": 42}
    q.refresh()
    assert q.ticket.state == "recovering" and q.ticket.result is None
    assert q.turn.state == "uncertain" and q.turn.ended_at is None
    assert q.endpoint.state == "quarantined"
    assert q.case.state == "open"
    assert EndpointLock.objects.get(endpoint=q.endpoint).holder_id == q.turn.id
    assert not ContextEntry.objects.filter(turn=q.turn).exists()

    second = services.inspect_case(case_id=q.case.id, user=owner)
    ev = second.snapshot["evidence"]
    assert [(i["kind"], i["seq"], i["for_this_turn"]) for i in ev["items"]] == [
        ("late_success", q.turn.seq, True)
    ]
    assert ev["items"][0]["detail"]["result"] == {"answer": 42}
    assert ev["late_result"] is True and ev["late_stop_receipt"] is False
    assert second.snapshot["outputs"]["result"] is None
    assert first.sha256 != second.sha256


def test_late_stop_receipt_is_called_out_and_carried_into_release(quarantine, owner):
    q = quarantine()
    runtime.finish_turn(
        turn_id=q.turn.id,
        seq=q.turn.seq,
        outcome=Outcome.stopped("agent_stop_receipt", {"exit": 0}),
        source="api",
    )
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    ev = inspection.snapshot["evidence"]
    assert ev["late_stop_receipt"] is True and ev["late_stop_receipt_at"]
    assert ev["items"][0]["kind"] == "late_stopped"
    assert q.refresh().turn.state == "uncertain"  # evidence only: the owner decides

    decide(
        q,
        owner,
        "release",
        inspection=inspection,
        evidence="the agent's stop receipt for seq 1 arrived after the grace",
    )
    q.refresh()
    assert q.turn.state == "stopped"
    assert q.turn.stop_evidence["kind"] == "owner_evidence"
    assert q.turn.stop_evidence["detail"]["late_stop_receipt"] is True


def test_a_stop_receipt_for_another_seq_is_not_a_receipt_for_this_turn(quarantine, owner):
    q = quarantine()
    runtime.finish_turn(
        turn_id=q.turn.id,
        seq=q.turn.seq + 7,
        outcome=Outcome.stopped("agent_stop_receipt", {}),
        source="api",
    )
    ev = services.inspect_case(case_id=q.case.id, user=owner).snapshot["evidence"]
    assert [(i["kind"], i["for_this_turn"]) for i in ev["items"]] == [("late_stopped", False)]
    assert ev["late_stop_receipt"] is False


# --- Decisions ------------------------------------------------------------------------------


def test_finalize_orphan_closes_the_turn_unresolved_and_orphans_the_ticket(quarantine, owner):
    q = quarantine()
    decision = decide(q, owner, "finalize_orphan", rationale="the work is not worth redoing")
    q.refresh()
    assert q.ticket.state == "orphaned"
    assert q.ticket.result is None
    assert q.ticket.error["code"] == "orphaned"
    assert q.ticket.finished_at is not None
    assert q.turn.state == "unresolved" and q.turn.ended_at is not None
    assert q.turn.stop_evidence is None
    assert q.endpoint.state == "available"
    assert EndpointLock.objects.get(endpoint=q.endpoint).holder_id is None
    assert q.case.state == "decided" and q.case.decided_at is not None
    assert decision.action == "finalize_orphan" and decision.rerun_ticket_id is None
    assert decision.rationale == "the work is not worth redoing"
    mine = {"turn_resolved", "orphaned", "recovery_decision"}
    new = [
        (e.kind, e.from_state, e.to_state, e.actor) for e in events(q.ticket.id) if e.kind in mine
    ]
    assert new == [
        ("turn_resolved", "", "", "user:owner"),
        ("orphaned", "recovering", "orphaned", "user:owner"),
        ("recovery_decision", "", "", "user:owner"),
    ]
    # The endpoint takes work again.
    assert admit_ticket(endpoint=q.endpoint.address, input={"seconds": 0}).ticket.state == "queued"


def test_authorize_rerun_admits_a_new_ticket_with_a_new_identity(quarantine, owner):
    q = quarantine(dedupe_key="brief-2024-w1", input={"seconds": 30, "topic": "x"})
    decision = decide(q, owner, "authorize_rerun", rationale="idempotent work: run it again")
    q.refresh()
    rerun = Ticket.objects.get(id=decision.rerun_ticket_id)
    assert rerun.id != q.ticket.id
    assert rerun.dedupe_key == "brief-2024-w1:rerun:1"
    assert rerun.parent_id == q.ticket.id
    assert rerun.trace_id == q.ticket.trace_id
    assert rerun.depth == q.ticket.depth + 1
    assert rerun.input == q.ticket.input and rerun.input_sha256 == q.ticket.input_sha256
    assert rerun.endpoint_id == q.ticket.endpoint_id
    assert rerun.requester == q.ticket.requester == {"name": "tester", "metadata": {"run": 1}}
    assert rerun.state == "queued" and rerun.turn_id is None
    # The original keeps no invented answer.
    assert q.ticket.state == "orphaned" and q.ticket.result is None
    assert q.ticket.error["rerun_ticket"] == str(rerun.id)
    assert q.turn.state == "unresolved"
    assert q.endpoint.state == "available"
    assert q.case.state == "decided"
    # The re-run counts on the trace (the circuit breaker's counter).
    assert Trace.objects.get(id=q.ticket.trace_id).tickets == 2
    admitted = events(rerun.id)[0]
    assert (admitted.kind, admitted.actor) == ("admitted", "user:owner")
    decision_event = last_event(q.ticket.id, "recovery_decision")
    assert decision_event.actor == "user:owner"
    assert decision_event.detail["rerun_ticket"] == str(rerun.id)


def test_the_rerun_carries_the_obligation_and_delivery_to_the_requester(
    quarantine, owner, make_endpoint
):
    """The orphaned original is not delivered (it would only say 'orphaned');
    its obligation passes to the re-run, whose result is delivered."""
    from tickets.models import Delivery

    q = quarantine(input={"seconds": 0.01})
    decision = decide(q, owner, "authorize_rerun", rationale="safe to repeat")
    q.refresh()
    rerun = Ticket.objects.get(id=decision.rerun_ticket_id)
    assert rerun.rerun_of_id == q.ticket.id
    assert not Delivery.objects.filter(ticket=q.ticket).exists()
    assert q.ticket.delivery_state == "none"
    assert q.ticket.obligation_state == "closed"
    assert str(rerun.id) in q.ticket.obligation_note
    assert rerun.obligation_state == "open"
    # Run the re-run in-process, as a worker would: it is delivered (pull).
    runtime.run_ticket(ticket_id=rerun.id)
    rerun.refresh_from_db()
    assert rerun.state == "succeeded"
    assert Delivery.objects.get(ticket=rerun).mode == "pull"
    assert rerun.delivery_state == "pending"


def test_rerun_of_a_ticket_without_a_key_derives_the_key_from_its_id(quarantine, owner):
    q = quarantine()
    decision = decide(q, owner, "authorize_rerun")
    assert decision.rerun_ticket.dedupe_key == f"{q.ticket.id}:rerun:1"


def test_rerun_skips_a_derived_key_somebody_already_uses(stuck_endpoint, owner):
    endpoint = stuck_endpoint()
    original = admit_ticket(endpoint=endpoint.address, input={"seconds": 30}, dedupe_key="k")
    # Queued behind the original before the quarantine, with the key a
    # re-run would derive first.
    squatter = admit_ticket(endpoint=endpoint.address, input={"x": 1}, dedupe_key="k:rerun:1")
    q = drive_to_quarantine(original.ticket.id)
    decision = decide(q, owner, "authorize_rerun")
    assert decision.rerun_ticket_id != squatter.ticket.id
    assert decision.rerun_ticket.dedupe_key == "k:rerun:2"
    assert decision.rerun_ticket.parent_id == q.ticket.id


def test_rerun_key_stays_within_the_dedupe_key_cap(quarantine, owner):
    q = quarantine(dedupe_key="k" * 255)
    key = decide(q, owner, "authorize_rerun").rerun_ticket.dedupe_key
    assert len(key) <= 255
    assert key == hashlib.sha256(("k" * 255).encode()).hexdigest() + ":rerun:1"


def test_a_rerun_that_is_quarantined_again_reruns_under_its_own_lineage(quarantine, owner):
    q = quarantine(dedupe_key="k")
    first = decide(q, owner, "authorize_rerun")
    again = drive_to_quarantine(first.rerun_ticket_id)
    assert again.case.id != q.case.id and again.turn.seq == 2
    second = decide(again, owner, "authorize_rerun")
    assert second.rerun_ticket.dedupe_key == "k:rerun:1:rerun:1"
    assert second.rerun_ticket.parent_id == first.rerun_ticket_id
    assert second.rerun_ticket.depth == 2
    assert second.rerun_ticket.trace_id == q.ticket.trace_id
    assert Trace.objects.get(id=q.ticket.trace_id).tickets == 3


def test_rerun_refused_by_the_circuit_breaker_writes_nothing(quarantine, owner, settings):
    q = quarantine()
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    before = dump_ledger()
    settings.TRACE_HARD_LIMIT = 1
    with pytest.raises(CircuitOpen):
        decide(q, owner, "authorize_rerun", inspection=inspection)
    assert dump_ledger() == before
    q.refresh()
    assert (q.case.state, q.ticket.state, q.turn.state, q.endpoint.state) == (
        "open",
        "recovering",
        "uncertain",
        "quarantined",
    )


def test_keep_quarantined_is_recorded_and_changes_nothing_else(quarantine, owner):
    q = quarantine()
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    decision = decide(
        q,
        owner,
        "keep_quarantined",
        inspection=inspection,
        rationale="the agent vendor is checking their side",
    )
    q.refresh()
    assert decision.action == "keep_quarantined"
    assert (q.case.state, q.ticket.state, q.turn.state, q.endpoint.state) == (
        "open",
        "recovering",
        "uncertain",
        "quarantined",
    )
    assert q.case.decided_at is None
    assert EndpointLock.objects.get(endpoint=q.endpoint).holder_id == q.turn.id
    with pytest.raises(EndpointQuarantined):
        admit_ticket(endpoint=q.endpoint.address, input={})
    assert last_event(q.ticket.id, "recovery_decision").detail["action"] == "keep_quarantined"
    # The case is still open: a later decision may rest on the same inspection.
    later = decide(q, owner, "finalize_orphan", inspection=inspection)
    assert later.inspection_id == inspection.id
    assert Decision.objects.filter(case=q.case).count() == 2
    assert q.refresh().case.state == "decided"


def test_release_needs_evidence_and_fails_the_ticket(quarantine, owner):
    q = quarantine()
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    for blank in ("", "   ", None):
        with pytest.raises(Invalid):
            decide(q, owner, "release", inspection=inspection, evidence=blank)
    assert Decision.objects.count() == 0
    decision = decide(
        q,
        owner,
        "release",
        inspection=inspection,
        evidence="host worker-3 was rebooted at 10:02; the process is gone",
    )
    q.refresh()
    assert decision.evidence == "host worker-3 was rebooted at 10:02; the process is gone"
    assert q.turn.state == "stopped"
    assert q.turn.stop_evidence["kind"] == "owner_evidence"
    assert q.turn.stop_evidence["actor"] == "user:owner"
    assert q.turn.stop_evidence["seq"] == q.turn.seq
    assert q.turn.stop_evidence["detail"]["text"].startswith("host worker-3 was rebooted")
    assert q.ticket.state == "failed" and q.ticket.result is None
    assert q.ticket.error["code"] == "released"
    assert "released by owner owner after evidence" in q.ticket.error["detail"]
    assert q.endpoint.state == "available"
    assert EndpointLock.objects.get(endpoint=q.endpoint).holder_id is None
    assert q.case.state == "decided"


@pytest.mark.parametrize(
    "action", ["finalize_orphan", "authorize_rerun", "release", "keep_quarantined"]
)
def test_a_decided_case_takes_no_further_decision(quarantine, owner, action):
    q = quarantine()
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    decide(q, owner, "finalize_orphan", inspection=inspection)
    before = dump_ledger()
    with pytest.raises(InvalidTransition) as refused:
        decide(q, owner, action, inspection=inspection, evidence="proof")
    assert refused.value.extra["state"] == "decided"
    assert dump_ledger() == before


def test_decision_rules_are_checked_before_anything_is_written(
    quarantine, owner, outsider, make_endpoint
):
    q = quarantine()
    other = quarantine()
    mine = services.inspect_case(case_id=q.case.id, user=owner)
    theirs = services.inspect_case(case_id=other.case.id, user=owner)
    before = dump_ledger(exclude=())
    bad = [
        (NotFound, dict(user=outsider, inspection_id=mine.id)),
        (Invalid, dict(inspection_id=theirs.id)),
        (Invalid, dict(inspection_id=None)),
        (Invalid, dict(inspection_id="not-an-id")),
        (Invalid, dict(inspection_id="01930000-0000-7000-8000-000000000000")),
        (Invalid, dict(inspection_id=mine.id, rationale="")),
        (Invalid, dict(inspection_id=mine.id, rationale="  \n ")),
        (Invalid, dict(inspection_id=mine.id, rationale=None)),
        (Invalid, dict(inspection_id=mine.id, action="shrug")),
    ]
    for error, kw in bad:
        args = {
            "case_id": q.case.id,
            "user": owner,
            "action": "finalize_orphan",
            "rationale": "why",
            **kw,
        }
        with pytest.raises(error):
            services.decide(**args)
    assert dump_ledger(exclude=()) == before


def test_staff_counts_as_an_owner_for_decisions(quarantine, staff_user):
    q = quarantine()
    decision = decide(q, staff_user, "finalize_orphan")
    assert decision.actor == staff_user
    assert last_event(q.ticket.id, "recovery_decision").actor == "user:staff"


@pytest.mark.django_db(transaction=True)
def test_two_owners_deciding_at_once_one_wins(quarantine, owner):
    """Real PostgreSQL, two threads: the ticket lock and the conditional
    case UPDATE let exactly one decision through."""
    q = quarantine()
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    barrier = threading.Barrier(2)
    outcomes: list = [None, None]

    def run(i: int, action: str) -> None:
        try:
            barrier.wait()
            services.decide(
                case_id=q.case.id,
                user=owner,
                action=action,
                inspection_id=inspection.id,
                rationale=f"owner {i}",
            )
            outcomes[i] = "decided"
        except Exception as exc:  # surfaced by the assertions below
            outcomes[i] = getattr(exc, "code", repr(exc))
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(0, "finalize_orphan")),
        threading.Thread(target=run, args=(1, "authorize_rerun")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["decided", "invalid_transition"], outcomes
    assert Decision.objects.filter(case=q.case).count() == 1
    assert TicketEvent.objects.filter(ticket=q.ticket, kind="recovery_decision").count() == 1
    q.refresh()
    assert q.ticket.state == "orphaned" and q.case.state == "decided"
    reruns = Ticket.objects.filter(parent=q.ticket).count()
    assert reruns == (1 if Decision.objects.get(case=q.case).action == "authorize_rerun" else 0)


# --- Lessons --------------------------------------------------------------------------------


def test_lesson_closes_a_decided_case(quarantine, owner):
    q = quarantine()
    decide(q, owner, "finalize_orphan")
    lesson = services.write_lesson(
        case_id=q.case.id,
        user=owner,
        what_failed="the runner ignores interrupts",
        evidence="no stop receipt within the grace; heartbeats continued",
        prevention="make the runner poll ctx.interrupted()",
    )
    q.refresh()
    assert q.case.state == "closed" and q.case.closed_at is not None
    assert lesson.what_failed == "the runner ignores interrupts"
    assert Lesson.objects.get(case=q.case).id == lesson.id
    last = events(q.ticket.id)[-1]
    assert (last.kind, last.actor, last.detail["lesson"]) == (
        "lesson_written",
        "user:owner",
        str(lesson.id),
    )


def test_lesson_needs_a_decided_case(quarantine, owner):
    q = quarantine()
    kw = dict(case_id=q.case.id, user=owner, what_failed="a", evidence="b", prevention="c")
    with pytest.raises(InvalidTransition) as refused:
        services.write_lesson(**kw)
    assert refused.value.extra["state"] == "open"
    decide(q, owner, "keep_quarantined")  # still open afterwards
    with pytest.raises(InvalidTransition):
        services.write_lesson(**kw)
    decide(q, owner, "finalize_orphan")
    services.write_lesson(**kw)
    with pytest.raises(InvalidTransition) as again:
        services.write_lesson(**kw)
    assert again.value.extra["state"] == "closed"
    assert Lesson.objects.count() == 1


def test_lesson_needs_all_three_texts_and_an_owner(quarantine, owner, outsider):
    q = quarantine()
    decide(q, owner, "finalize_orphan")
    full = dict(what_failed="a", evidence="b", prevention="c")
    for field in full:
        for blank in ("", " ", None):
            with pytest.raises(Invalid):
                services.write_lesson(case_id=q.case.id, user=owner, **{**full, field: blank})
    with pytest.raises(NotFound):
        services.write_lesson(case_id=q.case.id, user=outsider, **full)
    assert Lesson.objects.count() == 0
    assert q.refresh().case.state == "decided"
