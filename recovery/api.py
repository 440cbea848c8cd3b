"""Recovery routes: parse, call one service, render (API.md "Recovery")."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Status

from core import limits
from core.schemas import Strict
from endpoints.generation_selectors import proposal_detail
from endpoints.schemas import ProposalOut

from . import selectors, services
from .schemas import CaseOut, DecisionOut, InspectionOut, LessonWrittenOut, ProcessStopOut

router = Router(tags=["recovery"])

# The bounds list_cases enforces, declared so the OpenAPI document states them.
CASES_LIMIT = Query(100, ge=1, le=selectors.MAX_CASES)


# Ids and texts are optional in the schemas on purpose: the services explain
# a missing rationale, evidence or inspection with the documented 400, not a
# schema error.
class DecisionIn(Strict):
    action: Literal["finalize_orphan", "authorize_rerun", "keep_quarantined", "release"]
    inspection: str | None = Field(default=None, max_length=100)
    rationale: str | None = None
    evidence: str | None = None
    # authorize_rerun only: what the re-run runs instead of the original's
    # input, and its turn budget (at most the endpoint's).
    input: dict[str, Any] | None = None
    budget_s: int | None = Field(default=None, ge=1, strict=True)


class StopProcessIn(Strict):
    rationale: str | None = None


class LessonProposalIn(Strict):
    """A change of the case's endpoint the lesson proposes: a diff against
    the endpoint's current generation (API.md "Generations and proposals")."""

    generation: int = Field(ge=1)
    changes: dict[str, Any]
    reason: str | None = Field(default=None, max_length=limits.NOTE_CHARS)


class LessonIn(Strict):
    what_failed: str | None = None
    evidence: str | None = None
    prevention: str | None = None
    proposal: LessonProposalIn | None = None


@router.get("/cases", response=list[CaseOut])
def list_cases(request: HttpRequest, state: str | None = None, limit: int = CASES_LIMIT):
    cases = selectors.list_cases(
        cases=selectors.visible_cases(request.user), state=state, limit=limit
    )
    return [selectors.case_payload(c) for c in cases]


@router.get("/cases/{case_id}", response=CaseOut)
def get_case(request: HttpRequest, case_id: str):
    return selectors.case_payload(selectors.get_visible_case(case_id, user=request.user))


@router.post("/cases/{case_id}/inspections", response={201: InspectionOut})
def inspect(request: HttpRequest, case_id: str):
    inspection = services.inspect_case(case_id=case_id, user=request.user)
    return Status(201, selectors.inspection_payload(inspection))


@router.post("/cases/{case_id}/decisions", response={201: DecisionOut})
def decide(request: HttpRequest, case_id: str, payload: DecisionIn):
    decision = services.decide(
        case_id=case_id,
        user=request.user,
        action=payload.action,
        inspection_id=payload.inspection,
        rationale=payload.rationale,
        evidence=payload.evidence,
        rerun_input=payload.input,
        rerun_budget_s=payload.budget_s,
    )
    return Status(201, selectors.decision_payload(decision))


@router.post("/cases/{case_id}/lesson", response={201: LessonWrittenOut})
def lesson(request: HttpRequest, case_id: str, payload: LessonIn):
    written = services.write_lesson(
        case_id=case_id,
        user=request.user,
        what_failed=payload.what_failed,
        evidence=payload.evidence,
        prevention=payload.prevention,
        proposal=payload.proposal.model_dump() if payload.proposal else None,
    )
    return Status(201, {**selectors.lesson_payload(written), "case_state": "closed"})


@router.post("/cases/{case_id}/lesson/proposals", response={201: ProposalOut})
def propose_from_lesson(request: HttpRequest, case_id: str, payload: LessonProposalIn):
    """A change proposed from a closed case's lesson."""
    proposal = services.propose_from_lesson(
        case_id=case_id, user=request.user, proposal=payload.model_dump()
    )
    return Status(201, proposal_detail(proposal, user=request.user))


@router.post("/cases/{case_id}/stop-process", response={201: ProcessStopOut})
def stop_process(request: HttpRequest, case_id: str, payload: StopProcessIn):
    """An owner's "stop the process" for a decided case's turn that still
    holds a worker slot (409 when the case is open or no slot holds it)."""
    stop = services.stop_process(case_id=case_id, user=request.user, rationale=payload.rationale)
    return Status(201, selectors.process_stop_payload(stop))
