"""Ticket transitions after admission.

Every transition is one conditional UPDATE (``WHERE id = … AND state IN
(expected)``) plus its event row, inside the caller's transaction when there
is one. A row count of zero means another process got there first: the
transition raises ``InvalidTransition`` naming the state it found, and writes
nothing. What a terminal state owes (a delivery, a callback, an obligation
passed to a re-run) is ``tickets/terminal.py``'s to decide; the event rows are
``tickets/events.py``'s.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from core import observe
from core.errors import InvalidTransition, NotFound

from . import terminal as terminal_hooks
from .events import append_event, set_recorded_fields, update_fields
from .models import (
    TERMINAL_STATES,
    TICKET_EDGES,
    Ticket,
    TicketState,
)

log = logging.getLogger(__name__)


def transition(
    *,
    ticket_id: uuid.UUID,
    expected: str,
    to: str,
    kind: str,
    actor: str,
    turn_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
    **fields: Any,
) -> str:
    """Move a ticket from ``expected`` to ``to``; returns the prior state.

    Refuses edges the state machine does not have (a programming error) and
    a prior state that does not match (a race lost): both write nothing.
    """
    expected = str(expected)
    if to not in TICKET_EDGES[expected]:
        raise ValueError(f"no edge {expected} -> {to} in the ticket state machine")
    now = timezone.now()
    if to in TERMINAL_STATES:
        fields.setdefault("finished_at", now)
    # savepoint=False: a refused transition raises before writing anything,
    # and every caller lets the error end its transaction (no savepoint
    # round trips on the hot path).
    with transaction.atomic(savepoint=False):
        # The conditional UPDATE is the check (and takes the row lock): one
        # statement when it wins.
        updated = Ticket.objects.filter(id=ticket_id, state=expected).update(
            state=to, updated_at=now, **fields
        )
        if not updated:
            found = Ticket.objects.filter(id=ticket_id).values_list("state", flat=True).first()
            if found is None:
                raise NotFound(f"ticket {ticket_id} not found")
            raise InvalidTransition(
                f"ticket {ticket_id} is {found}; {kind} needs {expected}", state=found
            )
        terminal = terminal_hooks.context(ticket_id) if to in TERMINAL_STATES else None
        if terminal is not None:
            opened = terminal_hooks.open_delivery(*terminal)
            if opened is not None:
                # One event for the one transaction: the terminal event
                # records the delivery it opened (fewer bytes per ticket).
                detail = {**(detail or {}), "delivery_opened": opened}
        append_event(
            ticket_id=ticket_id,
            kind=kind,
            actor=actor,
            from_state=expected,
            to_state=to,
            turn_id=turn_id,
            detail=detail,
        )
        observe.transition(  # metrics at commit; a turn's ids for the worker's log lines
            ticket_id=ticket_id, expected=expected, to=to, kind=kind, turn_id=turn_id, fields=fields
        )
        if terminal is not None:
            terminal_hooks.on_terminal(*terminal)
    return expected


def request_cancel(*, ticket_id: uuid.UUID, actor: str, reason: str = "") -> uuid.UUID | None:
    """The ticket's side of a cancel (``runtime.services.cancel_ticket`` is
    the one caller): ``queued | waiting -> cancelled``; a running ticket
    gets ``cancel_requested_at`` and its event, and the answer is its turn,
    which the caller asks to stop (the ticket is cancelled when the stop is
    proven); None when there is no turn to interrupt. A ``reason`` is kept
    in the event's detail."""
    why = {"reason": reason} if reason else None
    with transaction.atomic():
        ticket = Ticket.objects.select_for_update().filter(id=ticket_id).first()
        if ticket is None:
            raise NotFound(f"ticket {ticket_id} not found")
        if ticket.state in (TicketState.QUEUED, TicketState.WAITING):
            transition(
                ticket_id=ticket_id,
                expected=ticket.state,
                to=TicketState.CANCELLED,
                kind="cancelled",
                actor=actor,
                detail=why,
                # One text for both ways a ticket is cancelled (the other:
                # a running ticket's turn proven stopped, in the finish).
                error=RawSQL("claimcheck_ticket_cancelled_error(p_actor => %s)", [actor]),
            )
            return None
        if ticket.state == TicketState.RUNNING:
            if ticket.cancel_requested_at is not None:
                return None
            update_fields(
                ticket_id=ticket_id,
                kind="cancel_requested",
                actor=actor,
                detail=why,
                cancel_requested_at=timezone.now(),
            )
            return ticket.turn_id
        raise InvalidTransition(
            f"ticket {ticket_id} is {ticket.state}: only queued, waiting or running "
            "tickets can be cancelled",
            state=ticket.state,
        )


__all__ = [
    "append_event",
    "request_cancel",
    "set_recorded_fields",
    "transition",
    "update_fields",
]
