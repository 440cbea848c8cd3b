"""Response bodies of the endpoint routes (API.md "Endpoints"): the shape
``runtime.selectors.endpoint_payload`` builds, generations, proposals and
routes. The runtime's own (turns, workers, agents) are in runtime/schemas.py."""

from __future__ import annotations

from typing import Any

from core.schemas import Out


class SubmittersOut(Out):
    users: list[str]
    groups: list[str]


class LockOut(Out):
    holder_turn: str | None = None
    token: int | None = None
    acquired_at: str | None = None


class PauseOut(Out):
    at: str
    # Who paused it and why: to its owners and staff only.
    by: str | None = None
    reason: str | None = None


class EndpointOut(Out):
    address: str
    aliases: list[str]
    runner: dict[str, Any]
    owners: list[str]
    submitters: SubmittersOut | None = None
    state: str
    lock: LockOut
    queued: int
    turn_seq: int
    generation: int
    notes: str | None = None
    change_requires_second_person: bool | None = None
    turn_budget_s: int | float
    interrupt_grace_s: int | float
    heartbeat_timeout_s: int | float
    requires_approval: bool
    busy_policy: str
    open_case: str | None = None
    # Null unless its owners paused it (a flag beside ``state``).
    paused: PauseOut | None = None


class EndpointPauseOut(EndpointOut):
    # False: it already was paused (or not paused, for a resume); nothing recorded.
    changed: bool


# --- Governed change (API.md "Generations and proposals") -------------------------------------


class OutcomesOut(Out):
    generation: int
    turns: int
    # The newest turns (at most 1,000) the rest are counted over.
    sampled: int
    succeeded: int
    failed: int
    timed_out: int
    quarantined: int
    running: int
    # How many of them ended on evidence (completed, failed, stopped): the
    # run-time percentiles are over these only; a quarantined turn has no
    # known end and is counted apart.
    measured: int = 0
    p50_s: float | None = None
    p95_s: float | None = None


class GenerationOut(Out):
    number: int
    config: dict[str, Any]
    changes: dict[str, Any]
    actor: str
    reason: str
    proposal: str | None = None
    restores: int | None = None
    first_seq: int
    at: str | None = None


class GenerationsOut(Out):
    endpoint: str
    generation: int
    generations: list[GenerationOut]
    # The current generation and the one before, newest first.
    outcomes: list[OutcomesOut]


class GenerationDetailOut(Out):
    endpoint: str
    generation: GenerationOut
    outcomes: list[OutcomesOut]


class ReviewOut(Out):
    id: str
    reviewer: str
    verdict: str
    reason: str
    generation: int | None = None
    at: str | None = None


class ProposalOut(Out):
    id: str
    endpoint: str
    base_generation: int
    current_generation: int
    changes: dict[str, Any]
    diff: dict[str, Any]
    reason: str
    proposer: str
    origin: dict[str, Any]
    restores: int | None = None
    created_at: str | None = None
    status: str  # open | stale | approved | rejected
    since: dict[str, Any] | None = None
    second_person_required: bool
    may_approve: bool
    review: ReviewOut | None = None
    # Approved: the generation it made and the one before, newest first.
    outcomes: list[OutcomesOut] | None = None


class RouteGenerationOut(Out):
    alias: str
    number: int
    endpoint: str | None = None
    actor: str
    reason: str
    at: str | None = None
