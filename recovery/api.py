"""Recovery routes: parse, call one service, render (API.md "Recovery")."""

from __future__ import annotations

from typing import Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from . import selectors, services

router = Router(tags=["recovery"])


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


# Ids and texts are optional in the schemas on purpose: the services explain
# a missing rationale, evidence or inspection with the documented 400, not a
# schema error.
class DecisionIn(Strict):
    action: Literal["finalize_orphan", "authorize_rerun", "keep_quarantined", "release"]
    inspection: str | None = Field(default=None, max_length=100)
    rationale: str | None = None
    evidence: str | None = None


class LessonIn(Strict):
    what_failed: str | None = None
    evidence: str | None = None
    prevention: str | None = None


@router.get("/cases", response=list[dict])
def list_cases(request: HttpRequest, state: str | None = None, limit: int = Query(100)):
    return [selectors.case_payload(c) for c in selectors.list_cases(state=state, limit=limit)]


@router.get("/cases/{case_id}", response=dict)
def get_case(request: HttpRequest, case_id: str):
    return selectors.case_payload(selectors.get_case(case_id))


@router.post("/cases/{case_id}/inspections", response={201: dict})
def inspect(request: HttpRequest, case_id: str):
    inspection = services.inspect_case(case_id=case_id, user=request.user)
    return Status(201, selectors.inspection_payload(inspection))


@router.post("/cases/{case_id}/decisions", response={201: dict})
def decide(request: HttpRequest, case_id: str, payload: DecisionIn):
    decision = services.decide(
        case_id=case_id,
        user=request.user,
        action=payload.action,
        inspection_id=payload.inspection,
        rationale=payload.rationale,
        evidence=payload.evidence,
    )
    return Status(201, selectors.decision_payload(decision))


@router.post("/cases/{case_id}/lesson", response={201: dict})
def lesson(request: HttpRequest, case_id: str, payload: LessonIn):
    written = services.write_lesson(
        case_id=case_id,
        user=request.user,
        what_failed=payload.what_failed,
        evidence=payload.evidence,
        prevention=payload.prevention,
    )
    return Status(201, {**selectors.lesson_payload(written), "case_state": "closed"})
