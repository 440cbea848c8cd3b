"""Open obligations: the list page (soonest due first, keyset-paginated)
and the dashboard's overdue ones, each with what its requester still lacks.
Every row starts from ``tickets.selectors.visible_tickets``."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.errors import DomainError, Invalid
from tickets.models import TERMINAL_STATES, DeliveryState, ObligationState, Ticket, TicketState
from tickets.selectors import visible_tickets

OBLIGATIONS_PAGE = 100


def _open_obligations(user):
    # Only tickets that answer to a requester carry an obligation: roots, and
    # re-runs (which have a parent, the ticket they replace, but take over its
    # obligation). So the state alone selects them, not ``parent IS NULL``.
    # The partial index ticket_obligation_open_idx covers exactly these rows.
    return (
        visible_tickets(user)
        .filter(obligation_state=ObligationState.OPEN)
        .select_related("endpoint", "turn")
    )


# A finished ticket whose result waits for the requester to pull it (no
# webhook): the platform owes nothing more, the requester has yet to fetch
# and acknowledge. Its obligation stays open until then (tickets.delivery),
# but the console does not call it overdue.
_AWAITING_PICKUP = Q(
    state__in=list(TERMINAL_STATES),
    delivery_state__in=[DeliveryState.PENDING, DeliveryState.ATTEMPTED],
) & (Q(requester__webhook_url__isnull=True) | Q(requester__webhook_url=""))


def awaiting_pickup(ticket: Ticket) -> bool:
    return (
        ticket.is_terminal
        and ticket.delivery_state in (DeliveryState.PENDING, DeliveryState.ATTEMPTED)
        and not (ticket.requester or {}).get("webhook_url")
    )


def requester_lacks(ticket: Ticket) -> str:
    """What the requester of an open obligation still lacks, in words."""
    if not ticket.is_terminal:
        return f"the result: the work is {ticket.state}"
    if ticket.delivery_state == DeliveryState.AWAITING_APPROVAL:
        return "the result: it waits for an owner's approval"
    if awaiting_pickup(ticket):
        if ticket.state != TicketState.SUCCEEDED:
            # A failed, cancelled or orphaned ticket has no result: what is
            # ready is the outcome, and what may be owed is a retry.
            return (
                f"to learn the outcome: the ticket {ticket.state} without a result (ready to "
                "pull); the requester has not acknowledged it, and a retry is an owner's call"
            )
        return "nothing owed: the result is ready to pull; the requester has not acknowledged it"
    if ticket.delivery_state == DeliveryState.FAILED:
        return "the result: its delivery failed"
    if ticket.delivery_state in (DeliveryState.PENDING, DeliveryState.ATTEMPTED):
        return "the result: its webhook delivery is being retried"
    return "an update on the ticket"


def overdue_obligations(*, user, limit: int = 20) -> list[Ticket]:
    """Open obligations past their update time that are really owed: a
    finished result waiting to be pulled is not a debt."""
    now = timezone.now()
    return list(
        _open_obligations(user)
        .filter(Q(obligation_due_at__lt=now) | Q(obligation_overdue=True))
        .exclude(_AWAITING_PICKUP)
        .order_by("obligation_due_at", "id")[:limit]
    )


def _encode_obligation_cursor(ticket: Ticket) -> str:
    raw = f"{ticket.obligation_due_at.isoformat()}|{ticket.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_obligation_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        due, ticket_id = raw.split("|", 1)
        parsed = parse_datetime(due)
        if parsed is None:
            raise ValueError(due)
        return parsed, uuid.UUID(ticket_id)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise Invalid("cursor is not one this page gave out") from None


def open_obligations(
    *, user, cursor: str | None = None, limit: int = OBLIGATIONS_PAGE
) -> tuple[list[Ticket], str | None]:
    """Open obligations of root tickets, soonest due first, so the overdue
    ones (due in the past) lead. Keyset-paginated on ``(due_at, id)``, which
    the partial index on open obligations serves."""
    qs = _open_obligations(user).filter(obligation_due_at__isnull=False)
    if cursor:
        due, ticket_id = _decode_obligation_cursor(cursor)
        qs = qs.filter(Q(obligation_due_at__gt=due) | Q(obligation_due_at=due, id__gt=ticket_id))
    rows = list(qs.order_by("obligation_due_at", "id")[: limit + 1])
    next_cursor = _encode_obligation_cursor(rows[limit - 1]) if len(rows) > limit else None
    now = timezone.now()
    for row in rows:
        row.lacks = requester_lacks(row)
        row.is_overdue = not awaiting_pickup(row) and (
            row.obligation_overdue or row.obligation_due_at < now
        )
    return rows[:limit], next_cursor


def obligation_list_page(*, user, cursor: str | None) -> dict[str, Any]:
    """The page's rows and cursors; a cursor this page did not give out is
    the page's ``error`` (answered 400) rather than an exception."""
    rows, next_cursor, error = [], None, None
    try:
        rows, next_cursor = open_obligations(user=user, cursor=cursor)
    except DomainError as exc:
        error = exc.detail
    return {
        "obligations": rows,
        "cursor": cursor,
        "next_cursor": next_cursor,
        "error": error,
    }
