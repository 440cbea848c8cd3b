"""Response bodies of the endpoint and turn routes (API.md "Endpoints",
"Turns"): the shapes ``endpoint_payload`` and ``turn_payload`` build."""

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


class TurnOut(Out):
    id: str
    endpoint: str
    ticket: str
    seq: int
    generation: int
    state: str
    started_at: str | None = None
    heartbeat_at: str | None = None
    deadline_at: str | None = None
    interrupt_requested_at: str | None = None
    ended_at: str | None = None
    stop_evidence: Any = None


class HeartbeatOut(TurnOut):
    interrupt_requested: bool


class SlotTurnOut(Out):
    # The process that runs the turn: the slot's warm turn process for an
    # isolated turn, the pool process for an inline one.
    pid: int
    isolated: bool
    id: str
    seq: int
    state: str
    endpoint: str
    ticket: str
    ticket_state: str
    budget_left_s: float


class WorkerSlotOut(Out):
    pid: int
    child_pid: int | None = None  # the slot's warm turn process, last forked
    status: str  # idle | running | interrupting | held
    turn: SlotTurnOut | None = None
    since: str | None = None


class WorkerOut(Out):
    name: str
    host: str
    pid: int
    queues: list[str]
    pool_size: int
    started_at: str | None = None
    last_seen_at: str | None = None
    status: str  # alive | lost
    # The queues it takes messages from now (a subset of ``queues`` once staff
    # stopped its consuming of one).
    consuming: list[str]
    busy: int
    slots: list[WorkerSlotOut]


class WorkerConsumingOut(Out):
    worker: str
    queue: str
    consume: bool
    # Did the worker's main process answer within 2 s (else: lost or no broker)?
    answered: bool
    consuming: list[str]


class WorkersOut(Out):
    workers: list[WorkerOut]
    held_turns: list[str]
    starved_endpoints: list[str]


class ConversationTurnOut(Out):
    seq: int
    ticket: str
    exchange: str | None = None
    status: str | None = None
    framework: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    at: str
    messages: list[Any]
    error: str | None = None


class ConversationOut(Out):
    endpoint: str
    turns: list[ConversationTurnOut]


class ApprovalDecisionOut(Out):
    approved: bool | None = None
    reason: str | None = None
    actor: str
    at: str


class PendingApprovalOut(Out):
    ticket: str
    call_id: str
    tool: str | None = None
    args: Any = None
    args_sha256: str | None = None
    turn: str | None = None
    decision: ApprovalDecisionOut | None = None


class ApprovalDecidedOut(Out):
    ticket: str
    call_id: str
    approved: bool
    approval_ticket: str
    duplicate: bool


# --- Governed change (API.md "Generations and proposals") -------------------------------------


class OutcomesOut(Out):
    generation: int
    turns: int
    succeeded: int
    failed: int
    timed_out: int
    quarantined: int
    running: int
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
