"""Response bodies of the ticket routes (API.md "Tickets"): the shapes
``tickets.selectors`` builds, declared for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from core.schemas import Out


class TurnRef(Out):
    id: str
    seq: int
    state: str


class ReturnToOut(Out):
    endpoint: str
    continuation: dict[str, Any] | None = None


class CallbackOut(Out):
    state: str
    ticket: str | None = None


class DeliveryOut(Out):
    state: str
    attempts: int


class ObligationOut(Out):
    state: str
    next_update_at: str | None = None
    overdue: bool
    note: str


class TicketOut(Out):
    id: str
    endpoint: str
    dedupe_key: str | None = None
    state: str
    parent: str | None = None
    trace_id: str
    depth: int
    input: Any
    result: Any = None
    error: Any = None
    artifacts: list[Any]
    turn: TurnRef | None = None
    completed_by_turn: str | None = None
    rerun_of: str | None = None
    retry_of: str | None = None
    retry: str | None = None
    budget_s: int | None = None
    return_to: ReturnToOut | None = None
    requester: dict[str, Any]
    callback: CallbackOut
    delivery: DeliveryOut
    obligation: ObligationOut
    created_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    duplicate: bool


class TicketPage(Out):
    items: list[TicketOut]
    next_cursor: str | None = None


class EventOut(Out):
    kind: str
    from_state: str
    to_state: str
    actor: str
    turn: str | None = None
    detail: Any = None
    at: str | None = None


class LineageNode(Out):
    id: str
    parent: str | None = None
    endpoint: str
    state: str
    depth: int
    retry_of: str | None = None


class LineageOut(Out):
    trace_id: str
    root: str | None = None
    nodes: list[LineageNode]
