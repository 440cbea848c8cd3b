"""Recovery: the case list, a case's page (its evidence, inspections,
decisions, lesson and the changes the lesson proposed) and the lesson list.
Cases and lessons come through ``recovery.selectors`` (``visible_cases``,
``list_cases``, ``list_lessons``): its endpoint's owners and staff see a
case, anyone else gets 404."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404

from core.errors import DomainError
from endpoints import generation_selectors
from endpoints.selectors import is_owner
from recovery import selectors as recovery_selectors
from recovery.models import CaseEvidence, CaseState, Decision, Inspection, Lesson, RecoveryCase
from recovery.selectors import tool_calls, visible_cases
from tickets.selectors import visible_tickets

from . import LIST_CAP


def case_list_page(*, user, state: str) -> dict[str, Any]:
    """The user's cases, newest first, in ``state`` if given; a state that
    is not one is the page's ``error`` (answered 400)."""
    error, cases = None, []
    try:
        cases = recovery_selectors.list_cases(
            cases=visible_cases(user), state=state or None, limit=LIST_CAP
        )
    except DomainError as exc:
        error = exc.detail
    return {
        "cases": cases,
        "state": state,
        "states": CaseState.values,
        "error": error,
        "cap": LIST_CAP,
    }


def case_page(case: RecoveryCase, *, user) -> dict[str, Any]:
    """A case's page; ``can_act`` (its endpoint's owners and staff) with
    what their forms need: the inspections a decision may rest on and, when
    the turn overran its budget, what a re-run would repeat."""
    can_act = is_owner(user, case.endpoint)
    detail = case_detail(case)
    context: dict[str, Any] = {
        "case": case,
        "d": detail,
        "can_act": can_act,
        # Another open case of the endpoint holds it quarantined once this
        # one is decided: name it, so the page does not dead-end.
        "holding_case": visible_cases(user)
        .filter(endpoint_id=case.endpoint_id, state=CaseState.OPEN)
        .exclude(id=case.id)
        .values_list("id", flat=True)
        .first(),
    }
    if detail.lesson is not None:
        # The changes the lesson proposed, and once approved their outcomes
        # beside the generation before: did it help?
        context["lesson_proposals"] = [
            generation_selectors.proposal_detail(p, user=user)
            for p in generation_selectors.proposals_from_lesson(detail.lesson.id)
        ]
    if can_act:
        context["rerun_warning"] = rerun_warning(case, user=user)
    return context


def lesson_list_page(*, user) -> dict[str, Any]:
    """The lessons of the user's cases, newest first, each with the changes
    it proposed (one query for the page)."""
    lessons = recovery_selectors.list_lessons(user=user, limit=LIST_CAP)
    proposed = generation_selectors.proposals_from_lessons([lesson.id for lesson in lessons])
    for lesson in lessons:
        lesson.proposals = [
            generation_selectors.proposal_payload(p, user=user)
            for p in proposed.get(str(lesson.id), [])
        ]
    return {"lessons": lessons, "cap": LIST_CAP}


@dataclass
class CaseDetail:
    case: RecoveryCase
    evidence: list[CaseEvidence]
    inspections: list[Inspection]
    decisions: list[Decision]
    lesson: Lesson | None
    # The uncertain turn's tool receipts, paired by call (agent runners).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def get_case(case_id: uuid.UUID, *, user) -> RecoveryCase:
    """A case the user may see (its endpoint's owners, staff); 404 otherwise."""
    case = (
        visible_cases(user).select_related("endpoint", "ticket", "turn").filter(id=case_id).first()
    )
    if case is None:
        raise Http404(f"case {case_id} not found")
    return case


def case_detail(case: RecoveryCase) -> CaseDetail:
    inspections = list(
        Inspection.objects.filter(case_id=case.id).select_related("actor").order_by("created_at")
    )
    return CaseDetail(
        case=case,
        evidence=list(CaseEvidence.objects.filter(case_id=case.id).order_by("id")),
        inspections=inspections,
        decisions=list(
            Decision.objects.filter(case_id=case.id)
            .select_related("actor", "inspection", "rerun_ticket")
            .order_by("created_at")
        ),
        lesson=Lesson.objects.filter(case_id=case.id).select_related("actor").first(),
        tool_calls=tool_calls(case.ticket_id, turn_id=case.turn_id),
    )


def case_inspections(case_id: uuid.UUID):
    """The inspections a decision on this case may rest on (form choices)."""
    return Inspection.objects.filter(case_id=case_id).order_by("-created_at")


def rerun_warning(case: RecoveryCase, *, user) -> dict[str, Any] | None:
    """When the case's turn was quarantined for overrunning its budget, what
    a re-run with the same input and budget repeats: that budget, and the
    last outcome of that input on the endpoint (its newest ticket with the
    same input hash). The case's own ticket matches, so the newest-first
    walk of the endpoint's tickets stops at or before it: bounded by the
    tickets admitted since. Of the tickets ``user`` may see (the case's
    owners see all of the endpoint's)."""
    turn = case.turn
    if turn is None or turn.interrupt_reason != "deadline":
        return None
    ticket = case.ticket
    last = (
        visible_tickets(user)
        .filter(endpoint_id=case.endpoint_id, input_sha256=ticket.input_sha256, id__gte=ticket.id)
        .select_related("turn")
        .order_by("-id")
        .first()
    )
    return {
        "seq": turn.seq,
        "budget_s": round((turn.deadline_at - turn.started_at).total_seconds()),
        "input": ticket.input,
        "last": last,
        "last_turn": last.turn if last is not None and last.turn_id else None,
    }


def case_for_owner(case_id: uuid.UUID, *, user) -> RecoveryCase:
    """The case, for an action on it: 404 unless the user sees it, 403
    should seeing ever stop meaning owning (defence in depth)."""
    case = get_case(case_id, user=user)
    if not is_owner(user, case.endpoint):
        raise PermissionDenied("only the endpoint's owners may act on its recovery case")
    return case
