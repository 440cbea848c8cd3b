"""Reads of recovery records shared by the API, the console and the commands.

``build_snapshot`` is the one place that decides what an inspection shows;
``recovery/services.py`` stores it, the renderers below only read.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from django.db.models import QuerySet

from core.canonical import canonical_json
from core.errors import Invalid, NotFound
from core.times import iso
from endpoints.generation_selectors import proposal_status, proposals_from_lesson, review_of
from endpoints.selectors import owned_endpoint_ids
from tickets.models import Callback, ContextEntry, EndpointLock, Ticket, TicketEvent, Turn
from tickets.selectors import event_payload, ticket_events, ticket_payload

from .models import CaseEvidence, CaseState, Decision, Inspection, Lesson, RecoveryCase

MAX_CASES = 500

# Evidence kinds written by ``runtime.turns.evidence.record_stale``: ``late_<outcome kind>``.
LATE_STOP_RECEIPT = "late_stopped"
LATE_RESULT_KINDS = ("late_success", "late_failure", "late_wait")


def parse_uuid(value: Any, what: str) -> uuid.UUID:
    """A path or body id; a malformed one is as unknown as a missing one (404)."""
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        raise NotFound(f"{what} {value} not found") from None


def visible_cases(user) -> QuerySet[RecoveryCase]:
    """The cases ``user`` may see: those of the endpoints they own; staff
    see all (API.md "Who may see and do what"). Lessons follow their case."""
    if user is None or not user.is_authenticated:
        return RecoveryCase.objects.none()
    owned = owned_endpoint_ids(user)
    if owned is None:  # staff
        return RecoveryCase.objects.all()
    return RecoveryCase.objects.filter(endpoint_id__in=owned)


def get_visible_case(case_id: uuid.UUID | str, *, user) -> RecoveryCase:
    """The case, if ``user`` may see it; otherwise 404 as for an unknown id."""
    case = (
        visible_cases(user)
        .select_related("endpoint", "turn")
        .filter(id=parse_uuid(case_id, "case"))
        .first()
    )
    if case is None:
        raise NotFound(f"case {case_id} not found")
    return case


def get_case(case_id: uuid.UUID | str) -> RecoveryCase:
    """Any case, for the services (which check the owner themselves)."""
    case = (
        RecoveryCase.objects.select_related("endpoint", "turn")
        .filter(id=parse_uuid(case_id, "case"))
        .first()
    )
    if case is None:
        raise NotFound(f"case {case_id} not found")
    return case


def list_cases(
    *, cases: QuerySet[RecoveryCase], state: str | None = None, limit: int = 100
) -> list[RecoveryCase]:
    """Newest first, from ``cases``: ``visible_cases(user)`` for a caller,
    every case for the operator's command line. Cases are rare (one per
    quarantine), so a plain limit is enough."""
    if state and state not in CaseState.values:
        raise Invalid(f"state must be one of {', '.join(CaseState.values)}")
    if not 1 <= limit <= MAX_CASES:
        raise Invalid(f"limit must be between 1 and {MAX_CASES}")
    qs: QuerySet[RecoveryCase] = cases.select_related("endpoint", "turn")
    if state:
        qs = qs.filter(state=state)
    return list(qs.order_by("-opened_at", "-id")[:limit])


def list_lessons(*, user, limit: int = 100) -> list[Lesson]:
    """The lessons of the cases ``user`` may see, newest first."""
    return list(
        Lesson.objects.filter(case__in=visible_cases(user))
        .select_related("actor", "case__endpoint")
        .order_by("-created_at")[:limit]
    )


def snapshot_sha256(snapshot: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace, UTF-8): the
    same digest whoever recomputes it from the stored snapshot."""
    return hashlib.sha256(canonical_json(snapshot)).hexdigest()


# --- Payloads -------------------------------------------------------------------------------


def inspection_payload(inspection: Inspection, *, snapshot: bool = True) -> dict[str, Any]:
    payload = {
        "id": str(inspection.id),
        "case": str(inspection.case_id),
        "sha256": inspection.sha256,
        "created_at": iso(inspection.created_at),
        "actor": inspection.actor.username,
    }
    if snapshot:
        payload["snapshot"] = inspection.snapshot
    return payload


def decision_payload(decision: Decision) -> dict[str, Any]:
    return {
        "id": str(decision.id),
        "case": str(decision.case_id),
        "action": decision.action,
        "actor": decision.actor.username,
        "rationale": decision.rationale,
        "evidence": decision.evidence,
        "inspection": str(decision.inspection_id),
        "created_at": iso(decision.created_at),
        "rerun_ticket": str(decision.rerun_ticket_id) if decision.rerun_ticket_id else None,
    }


def lesson_payload(lesson: Lesson) -> dict[str, Any]:
    return {
        "id": str(lesson.id),
        "case": str(lesson.case_id),
        "actor": lesson.actor.username,
        "what_failed": lesson.what_failed,
        "evidence": lesson.evidence,
        "prevention": lesson.prevention,
        "created_at": iso(lesson.created_at),
        # The changes it proposed, each with its status and, once approved,
        # the generation that applied it.
        "proposals": [
            {
                "id": str(p.id),
                "endpoint": p.endpoint.address,
                "status": proposal_status(p),
                "generation": review.generation if (review := review_of(p)) else None,
            }
            for p in proposals_from_lesson(lesson.id)
        ],
    }


def case_payload(case: RecoveryCase, *, snapshots: bool = True) -> dict[str, Any]:
    """The documented case shape. ``snapshots=False`` leaves the (large)
    inspection snapshots out, for listings on the console and the command line."""
    inspections = Inspection.objects.select_related("actor").filter(case=case)
    decisions = Decision.objects.select_related("actor").filter(case=case)
    lesson = Lesson.objects.select_related("actor").filter(case=case).first()
    return {
        "id": str(case.id),
        "endpoint": case.endpoint.address,
        "ticket": str(case.ticket_id),
        "turn": str(case.turn_id),
        "turn_seq": case.turn.seq,
        "reason": case.reason,
        "state": case.state,
        "opened_at": iso(case.opened_at),
        "decided_at": iso(case.decided_at),
        "closed_at": iso(case.closed_at),
        "evidence_count": CaseEvidence.objects.filter(case=case).count(),
        "inspections": [
            inspection_payload(i, snapshot=snapshots) for i in inspections.order_by("created_at")
        ],
        "decisions": [decision_payload(d) for d in decisions.order_by("created_at")],
        "lesson": lesson_payload(lesson) if lesson else None,
    }


# --- The inspection snapshot -----------------------------------------------------------------


def _turn_snapshot(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.id),
        "endpoint": turn.endpoint.address,
        "ticket": str(turn.ticket_id),
        "seq": turn.seq,
        "state": turn.state,
        "runner_kind": turn.runner_kind,
        "celery_task_id": turn.celery_task_id,
        "worker": turn.worker,
        "started_at": iso(turn.started_at),
        "heartbeat_at": iso(turn.heartbeat_at),
        "deadline_at": iso(turn.deadline_at),
        "interrupt_requested_at": iso(turn.interrupt_requested_at),
        "interrupt_reason": turn.interrupt_reason,
        "ended_at": iso(turn.ended_at),
        "stop_evidence": turn.stop_evidence,
    }


def _lock_snapshot(case: RecoveryCase) -> dict[str, Any]:
    lock = EndpointLock.objects.filter(endpoint_id=case.endpoint_id).first()
    holder = lock.holder_id if lock else None
    return {
        "holder_turn": str(holder) if holder else None,
        "held_by_uncertain_turn": holder == case.turn_id,
        "token": lock.token if lock else None,
        "acquired_at": iso(lock.acquired_at) if lock else None,
    }


def _callbacks_snapshot(ticket: Ticket) -> list[dict[str, Any]]:
    """Callbacks whose source is the ticket or one of its children."""
    sources = [ticket.id, *Ticket.objects.filter(parent_id=ticket.id).values_list("id", flat=True)]
    rows = (
        Callback.objects.filter(source_id__in=sources)
        .select_related("target", "ticket")
        .order_by("source_id")
    )
    return [
        {
            "source": str(cb.source_id),
            "target": cb.target.address,
            "ticket": str(cb.ticket_id) if cb.ticket_id else None,
            "ticket_state": cb.ticket.state if cb.ticket_id else None,
            "created_at": iso(cb.created_at),
        }
        for cb in rows
    ]


def _outputs_snapshot(ticket: Ticket, turn: Turn) -> dict[str, Any]:
    entries = ContextEntry.objects.filter(turn_id=turn.id).order_by("seq")
    return {
        "result": ticket.result,
        "error": ticket.error,
        "artifacts": ticket.artifacts or [],
        "context_entries": [
            {
                "seq": e.seq,
                "ticket": str(e.ticket_id),
                "input": e.input,
                "result": e.result,
                "artifacts": e.artifacts,
                "created_at": iso(e.created_at),
            }
            for e in entries
        ],
    }


def _evidence_snapshot(case: RecoveryCase, turn: Turn) -> dict[str, Any]:
    """What arrived for the uncertain turn after quarantine. A late stop
    receipt naming the turn's own ``seq`` is what a ``release`` should rest
    on, so it is called out rather than left to be found in the list."""
    rows = list(CaseEvidence.objects.filter(case=case).order_by("id"))
    items = [
        {
            "id": e.id,
            "kind": e.kind,
            "seq": e.seq,
            "for_this_turn": e.seq == turn.seq,
            "detail": e.detail,
            "at": iso(e.at),
        }
        for e in rows
    ]
    receipts = [e for e in rows if e.kind == LATE_STOP_RECEIPT and e.seq == turn.seq]
    results = [e for e in rows if e.kind in LATE_RESULT_KINDS and e.seq == turn.seq]
    return {
        "items": items,
        "late_stop_receipt": bool(receipts),
        "late_stop_receipt_at": iso(receipts[0].at) if receipts else None,
        "late_result": bool(results),
        "turn_stop_evidence": turn.stop_evidence is not None,
    }


def build_snapshot(case: RecoveryCase) -> dict[str, Any]:
    """Everything an owner needs to decide, as plain JSON. The caller holds
    the ticket's row lock, so the runtime (which locks the ticket first for
    every change to it, its turn, the lock and the case evidence) cannot
    change what is read here halfway through."""
    ticket = Ticket.objects.select_related("endpoint", "turn", "return_to").get(id=case.ticket_id)
    turn = Turn.objects.select_related("endpoint").get(id=case.turn_id)
    endpoint = turn.endpoint
    return {
        "case": {
            "id": str(case.id),
            "state": case.state,
            "reason": case.reason,
            "opened_at": iso(case.opened_at),
        },
        "endpoint": {
            "address": endpoint.address,
            "state": endpoint.state,
            "turn_seq": endpoint.turn_seq,
            "runner": endpoint.runner,
            "turn_budget_s": endpoint.turn_budget_s,
            "interrupt_grace_s": endpoint.interrupt_grace_s,
            "heartbeat_timeout_s": endpoint.heartbeat_timeout_s,
        },
        "ticket": ticket_payload(ticket),
        "turn": _turn_snapshot(turn),
        "lock": _lock_snapshot(case),
        "callbacks": _callbacks_snapshot(ticket),
        "outputs": _outputs_snapshot(ticket, turn),
        "events": [event_payload(e) for e in ticket_events(ticket.id)],
        "tool_calls": tool_calls(ticket.id, turn_id=turn.id),
        "evidence": _evidence_snapshot(case, turn),
    }


def tool_calls(ticket_id: uuid.UUID, *, turn_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """An agent turn's tool receipts paired by call: what already happened
    (``slow`` started at 12:03:41Z, no end recorded) before anyone decides
    what to do about an uncertain turn."""
    rows = TicketEvent.objects.filter(ticket_id=ticket_id, kind__in=("tool_started", "tool_ended"))
    if turn_id is not None:
        rows = rows.filter(turn_id=turn_id)
    calls: dict[str, dict[str, Any]] = {}
    for e in rows.order_by("id"):
        call_id = str(e.detail.get("call_id"))
        call = calls.setdefault(
            call_id,
            {
                "call_id": call_id,
                "tool": e.detail.get("tool"),
                "turn": str(e.turn_id) if e.turn_id else None,
                "started_at": None,
                "ended_at": None,
                "status": None,
                "duration_ms": None,
                "args_sha256": None,
                "side_effect": False,
                "idempotency_key": None,
            },
        )
        if e.kind == "tool_started":
            call["started_at"] = iso(e.at)
            call["args_sha256"] = e.detail.get("args_sha256")
            call["side_effect"] = bool(e.detail.get("side_effect"))
            call["idempotency_key"] = e.detail.get("idempotency_key")
        else:
            call["ended_at"] = iso(e.at)
            call["status"] = e.detail.get("status")
            call["duration_ms"] = e.detail.get("duration_ms")
    return list(calls.values())


def process_stop_payload(stop) -> dict[str, Any]:
    return {
        "id": str(stop.id),
        "case": str(stop.case_id),
        "actor": stop.actor.get_username(),
        "rationale": stop.rationale,
        "worker": stop.worker,
        "host": stop.host,
        "pid": stop.pid,
        "outcome": stop.outcome,
        "exit": stop.exit,
        "created_at": iso(stop.created_at),
        "done_at": iso(stop.done_at),
    }
