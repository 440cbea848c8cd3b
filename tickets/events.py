"""A ticket's events, and the changes of its non-state fields that an event
records. The floor of the ticket app's write path: it imports no other
service (``lifecycle``, ``callbacks``, ``delivery``, ``terminal`` all write
through it)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import waits
from .models import Ticket, TicketEvent


def append_event(
    *,
    ticket_id: uuid.UUID,
    kind: str,
    actor: str = "",
    from_state: str = "",
    to_state: str = "",
    turn_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
) -> TicketEvent:
    """Record an event of the ticket and wake its watchers at commit (the
    API's ``wait_s``, the console's live regions: tickets/waits.py)."""
    event = TicketEvent.objects.create(
        ticket_id=ticket_id,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        turn_id=turn_id,
        detail=detail or {},
        at=timezone.now(),
    )
    waits.notify_changed(ticket_id)
    return event


def update_fields(*, ticket_id: uuid.UUID, kind: str, actor: str, detail=None, **fields) -> None:
    """Change non-state fields of a ticket (delivery, callback, obligation),
    with an event, in one transaction. The work state only moves through
    ``transition``."""
    with transaction.atomic(savepoint=False):
        set_recorded_fields(ticket_id=ticket_id, **fields)
        append_event(ticket_id=ticket_id, kind=kind, actor=actor, detail=detail)


def set_recorded_fields(*, ticket_id: uuid.UUID, **fields) -> None:
    """Change non-state fields of a ticket whose change an event of the same
    transaction records: ``update_fields``'s own event, or the terminal event,
    which records the delivery it opens."""
    if "state" in fields:
        raise ValueError("non-state fields only: the work state moves through transition()")
    Ticket.objects.filter(id=ticket_id).update(updated_at=timezone.now(), **fields)
