"""Response schemas of the runtime's routes (runtime/api.py)."""

from __future__ import annotations

from typing import Any

from core.schemas import Out


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
