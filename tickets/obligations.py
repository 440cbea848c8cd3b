"""Obligations: a root ticket keeps its promise to the requester visible until
the answer is delivered or an accountable owner closes it explicitly.

Obligation edges (``Ticket.obligation_state``)::

    none                      children and callbacks: their root carries it
    open   -> open            an owner sets the next update time or the posture note
    open   -> closed          delivered (tickets/delivery/), or closed by an owner here

``obligation_due_at`` is when the next update is owed; the sweep flags an open
obligation past it as overdue (once, with an event) through the partial index
``ticket_obligation_open_idx``. Setting a new time clears the flag.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core import limits
from core.errors import Forbidden, Invalid, InvalidTransition, NotFound
from core.times import as_utc
from endpoints.selectors import is_owner

from .events import update_fields
from .models import ObligationState, Ticket

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = limits.NOTE_CHARS
SWEEP_BATCH = 500


def _owned_open_ticket(*, ticket_id: uuid.UUID, user, doing: str) -> Ticket:
    """Lock the ticket; refuse a non-owner (403) or a ticket whose obligation
    is not open (409). Call inside a transaction."""
    ticket = Ticket.objects.select_for_update().filter(id=ticket_id).first()
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    if not is_owner(user, ticket.endpoint):
        raise Forbidden(f"only an owner of {ticket.endpoint.address} may {doing}")
    if ticket.obligation_state != ObligationState.OPEN:
        why = (
            "it is not a root ticket: its root carries the obligation"
            if ticket.obligation_state == ObligationState.NONE
            else "it is already closed"
        )
        raise InvalidTransition(
            f"ticket {ticket_id} has no open obligation: {why}",
            state=ticket.state,
            obligation=ticket.obligation_state,
        )
    return ticket


def _clean_note(note: str | None) -> str | None:
    if note is None:
        return None
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise Invalid(f"note must be text of at most {MAX_NOTE_CHARS} characters")
    return note.strip()


def close_obligation(*, ticket_id: uuid.UUID, user, note: str) -> Ticket:
    """``open -> closed`` by an owner (or staff), with the residual posture
    note saying why nothing more is owed. The ticket's work and delivery go
    on unchanged; a later delivery leaves the closed obligation as it is."""
    note = _clean_note(note)
    if not note:
        raise Invalid("closing an obligation needs a note saying why nothing more is owed")
    with transaction.atomic():
        _owned_open_ticket(ticket_id=ticket_id, user=user, doing="close its obligations")
        update_fields(
            ticket_id=ticket_id,
            kind="obligation_closed",
            actor=f"user:{user.username}",
            detail={"note": note},
            obligation_state=ObligationState.CLOSED,
            obligation_due_at=None,
            obligation_note=note,
        )
    return Ticket.objects.get(id=ticket_id)


def update_obligation(
    *,
    ticket_id: uuid.UUID,
    user,
    next_update_at: datetime | None = None,
    note: str | None = None,
) -> Ticket:
    """Set when the next update is owed and/or the residual posture note of
    an open obligation (owner or staff). A new time clears the overdue flag.
    A time without a zone is taken as UTC; it must lie in the future."""
    note = _clean_note(note)
    if next_update_at is None and note is None:
        raise Invalid("give next_update_at, note or both")
    fields: dict = {}
    detail: dict = {}
    if next_update_at is not None:
        next_update_at = as_utc(next_update_at, "next_update_at")
        if next_update_at <= timezone.now():
            raise Invalid("next_update_at must be in the future")
        fields.update(obligation_due_at=next_update_at, obligation_overdue=False)
        detail["next_update_at"] = next_update_at.isoformat()
    if note is not None:
        fields["obligation_note"] = note
        detail["note"] = note
    with transaction.atomic():
        _owned_open_ticket(ticket_id=ticket_id, user=user, doing="update its obligations")
        update_fields(
            ticket_id=ticket_id,
            kind="obligation_updated",
            actor=f"user:{user.username}",
            detail=detail,
            **fields,
        )
    return Ticket.objects.get(id=ticket_id)


def overdue_unflagged(now):
    """Open obligations past due and not yet flagged, oldest due first.
    ticket_obligation_due_idx holds exactly the open, unflagged ones: an
    obligation flagged long ago and still open (a result nobody pulled)
    costs a pass nothing, however many there are: they only accumulate, so
    a pass that read them would slow as the ledger grows."""
    return Ticket.objects.filter(
        obligation_state=ObligationState.OPEN,
        obligation_due_at__lte=now,
        obligation_overdue=False,
    ).order_by("obligation_due_at")


def sweep_overdue(*, limit: int = SWEEP_BATCH) -> list[uuid.UUID]:
    """Flag open obligations whose next update is past due.

    1. In one transaction, lock a batch of open, due, not yet flagged tickets
       with ``SKIP LOCKED`` (a ticket in the middle of a transition is taken
       next round; two sweepers take disjoint batches): ``overdue_unflagged``.
    2. For each: ``obligation_overdue = true`` and an ``obligation_overdue``
       event, through ``update_fields``. Flagged once: the flag is in the
       filter, so a later sweep does not repeat the event.
    """
    now = timezone.now()
    with transaction.atomic():
        due = list(
            overdue_unflagged(now)
            .select_for_update(skip_locked=True)
            .values_list("id", "obligation_due_at")[:limit]
        )
        for ticket_id, due_at in due:
            update_fields(
                ticket_id=ticket_id,
                kind="obligation_overdue",
                actor="sweeper",
                detail={"due_at": due_at.isoformat()},
                obligation_overdue=True,
            )
    if due:
        log.warning("%d obligation(s) passed their update time", len(due))
    return [ticket_id for ticket_id, _ in due]
