"""Response bodies of the recovery routes (API.md "Recovery"): the shapes
``recovery.selectors`` builds."""

from __future__ import annotations

from typing import Any

from core.schemas import Out


class InspectionOut(Out):
    id: str
    case: str
    sha256: str
    created_at: str | None = None
    actor: str
    snapshot: dict[str, Any]


class DecisionOut(Out):
    id: str
    case: str
    action: str
    actor: str
    rationale: str
    evidence: str
    inspection: str
    created_at: str | None = None
    rerun_ticket: str | None = None


class LessonProposalOut(Out):
    id: str
    endpoint: str
    status: str
    generation: int | None = None


class LessonOut(Out):
    id: str
    case: str
    actor: str
    what_failed: str
    evidence: str
    prevention: str
    created_at: str | None = None
    proposals: list[LessonProposalOut] = []


class LessonWrittenOut(LessonOut):
    case_state: str


class CaseOut(Out):
    id: str
    endpoint: str
    ticket: str
    turn: str
    turn_seq: int
    reason: str
    state: str
    opened_at: str | None = None
    decided_at: str | None = None
    closed_at: str | None = None
    evidence_count: int
    inspections: list[InspectionOut]
    decisions: list[DecisionOut]
    lesson: LessonOut | None = None


class ProcessStopOut(Out):
    id: str
    case: str
    actor: str
    rationale: str
    worker: str
    host: str
    pid: int
    outcome: str  # requested | killed | gone | refused | unreachable (exit.reason says why)
    exit: dict[str, Any]
    created_at: str | None = None
    done_at: str | None = None
