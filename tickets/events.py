"""A ticket's events, and the changes of its non-state fields that an event
records. The floor of the ticket app's write path: it imports no other
service (``callbacks``, ``delivery``, ``obligations`` write through it). A
move of the state writes its own event, in the database
(``claimcheck_ticket_write``: tickets/lifecycle.py)."""

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
    turn_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
) -> TicketEvent:
    """Record an event of the ticket that is no move of its state, and wake
    its watchers at commit (the API's ``wait_s``, the console's live
    regions: tickets/waits.py). A move's event, with its states, is written
    with the move (``claimcheck_ticket_write``)."""
    event = TicketEvent.objects.create(
        ticket_id=ticket_id,
        kind=kind,
        from_state="",
        to_state="",
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
    ``transition`` (claimcheck_ticket_move)."""
    if "state" in fields:
        raise ValueError("non-state fields only: the work state moves through transition()")
    with transaction.atomic(savepoint=False):
        Ticket.objects.filter(id=ticket_id).update(updated_at=timezone.now(), **fields)
        append_event(ticket_id=ticket_id, kind=kind, actor=actor, detail=detail)
