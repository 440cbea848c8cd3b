"""Reads of the ledger shared by the API, the console and delivery."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from django.db.models import QuerySet

from config.errors import Invalid, NotFound

from .models import CallbackState, DeliveryState, Ticket, TicketEvent

MAX_PAGE = 200


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def get_ticket(ticket_id: uuid.UUID | str) -> Ticket:
    try:
        ticket_id = uuid.UUID(str(ticket_id))
    except ValueError:
        raise NotFound(f"ticket {ticket_id} not found") from None
    ticket = (
        Ticket.objects.select_related("endpoint", "turn", "return_to").filter(id=ticket_id).first()
    )
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


def ticket_payload(ticket: Ticket, *, duplicate: bool = False) -> dict[str, Any]:
    turn = ticket.turn if ticket.turn_id else None
    callback_ticket = None
    if ticket.callback_state not in (CallbackState.NONE, CallbackState.PENDING):
        callback_ticket = (
            Ticket.objects.filter(callback_for_id=ticket.id).values_list("id", flat=True).first()
        )
    attempts = 0
    if ticket.delivery_state != DeliveryState.NONE:
        from .models import Delivery

        attempts = (
            Delivery.objects.filter(ticket_id=ticket.id).values_list("attempts", flat=True).first()
            or 0
        )
    return {
        "id": str(ticket.id),
        "endpoint": ticket.endpoint.address,
        "dedupe_key": ticket.dedupe_key,
        "state": ticket.state,
        "parent": str(ticket.parent_id) if ticket.parent_id else None,
        "trace_id": ticket.trace_id,
        "depth": ticket.depth,
        "input": ticket.input,
        "result": ticket.result,
        "error": ticket.error,
        "artifacts": ticket.artifacts or [],
        "turn": {"id": str(turn.id), "seq": turn.seq, "state": turn.state} if turn else None,
        "completed_by_turn": str(ticket.completed_by_turn_id)
        if ticket.completed_by_turn_id
        else None,
        "rerun_of": str(ticket.rerun_of_id) if ticket.rerun_of_id else None,
        "return_to": (
            {"endpoint": ticket.return_to.address, "continuation": ticket.continuation}
            if ticket.return_to_id
            else None
        ),
        "requester": ticket.requester or {},
        "callback": {
            "state": ticket.callback_state,
            "ticket": str(callback_ticket) if callback_ticket else None,
        },
        "delivery": {"state": ticket.delivery_state, "attempts": attempts},
        "obligation": {
            "state": ticket.obligation_state,
            "next_update_at": iso(ticket.obligation_due_at),
            "overdue": ticket.obligation_overdue,
            "note": ticket.obligation_note,
        },
        "created_at": iso(ticket.created_at),
        "updated_at": iso(ticket.updated_at),
        "finished_at": iso(ticket.finished_at),
        "duplicate": duplicate,
    }


def encode_cursor(ticket_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(ticket_id.bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return uuid.UUID(bytes=raw)
    except (ValueError, TypeError):
        raise Invalid("cursor is not one this API returned") from None


def list_tickets(
    *,
    endpoint_id: int | None = None,
    state: str | None = None,
    trace_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Ticket], str | None]:
    """Newest first, keyset-paginated on the time-ordered id (no OFFSET, no COUNT)."""
    if not 1 <= limit <= MAX_PAGE:
        raise Invalid(f"limit must be between 1 and {MAX_PAGE}")
    qs: QuerySet[Ticket] = Ticket.objects.select_related("endpoint", "turn", "return_to")
    if endpoint_id is not None:
        qs = qs.filter(endpoint_id=endpoint_id)
    if state:
        from .models import TicketState

        if state not in TicketState.values:
            raise Invalid(f"state must be one of {', '.join(TicketState.values)}")
        qs = qs.filter(state=state)
    if trace_id:
        qs = qs.filter(trace_id=trace_id)
    if cursor:
        qs = qs.filter(id__lt=decode_cursor(cursor))
    rows = list(qs.order_by("-id")[: limit + 1])
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor


def event_payload(event: TicketEvent) -> dict[str, Any]:
    return {
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "actor": event.actor,
        "turn": str(event.turn_id) if event.turn_id else None,
        "detail": event.detail,
        "at": iso(event.at),
    }


def ticket_events(ticket_id: uuid.UUID) -> list[TicketEvent]:
    return list(TicketEvent.objects.filter(ticket_id=ticket_id).order_by("id"))


def lineage(ticket: Ticket) -> dict[str, Any]:
    nodes = list(
        Ticket.objects.filter(trace_id=ticket.trace_id)
        .select_related("endpoint")
        .order_by("id")
        .only("id", "parent_id", "endpoint__address", "state", "depth", "trace_id")
    )
    roots = [n for n in nodes if n.parent_id is None]
    return {
        "trace_id": ticket.trace_id,
        "root": str(roots[0].id) if roots else None,
        "nodes": [
            {
                "id": str(n.id),
                "parent": str(n.parent_id) if n.parent_id else None,
                "endpoint": n.endpoint.address,
                "state": n.state,
                "depth": n.depth,
            }
            for n in nodes
        ],
    }
