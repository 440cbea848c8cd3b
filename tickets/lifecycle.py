"""Ticket transitions after admission.

Every transition is one conditional UPDATE (``WHERE id = … AND state IN
(expected)``) plus its event row, inside the caller's transaction when there
is one. A row count of zero means another process got there first: the
transition raises ``InvalidTransition`` naming the state it found, and writes
nothing.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from config import observe
from config.errors import InvalidTransition, NotFound

from . import waits
from .models import (
    TERMINAL_STATES,
    TICKET_EDGES,
    CallbackState,
    ObligationState,
    Ticket,
    TicketEvent,
    TicketState,
)
from .ports import endpoint_directory

log = logging.getLogger(__name__)


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
            state=to, updated_at=now, version=F("version") + 1, **fields
        )
        if not updated:
            found = Ticket.objects.filter(id=ticket_id).values_list("state", flat=True).first()
            if found is None:
                raise NotFound(f"ticket {ticket_id} not found")
            raise InvalidTransition(
                f"ticket {ticket_id} is {found}; {kind} needs {expected}", state=found
            )
        terminal = _terminal_context(ticket_id) if to in TERMINAL_STATES else None
        if terminal is not None:
            opened = _open_delivery(*terminal)
            if opened is not None:
                # One event for the one transaction: the terminal event
                # records the delivery it opened (issue 12: bytes per ticket).
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
            _on_terminal(*terminal)
    return expected


def after_terminal(*, ticket_id: uuid.UUID) -> None:
    """The hooks of a terminal transition that ``transition`` did not make
    (a turn's finish, ``claimcheck_finish_turn``, which opens the delivery
    itself): the callback a child owes its parent. In the caller's
    transaction, which holds the ticket row."""
    _on_terminal(*_terminal_context(ticket_id))


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
    Ticket.objects.filter(id=ticket_id).update(
        updated_at=timezone.now(), version=F("version") + 1, **fields
    )


def _terminal_context(ticket_id: uuid.UUID) -> tuple[Ticket, uuid.UUID | None]:
    """The ticket that just became terminal, and the re-run that supersedes
    it, if any."""
    ticket = Ticket.objects.select_related("endpoint").get(id=ticket_id)
    # Only an orphaned ticket can have been superseded by a re-run (admitted
    # in the same decision, before this transition).
    rerun = (
        Ticket.objects.filter(rerun_of_id=ticket_id).values_list("id", flat=True).first()
        if ticket.state == TicketState.ORPHANED
        else None
    )
    return ticket, rerun


def _root_like(ticket: Ticket) -> bool:
    """A root ticket, or a re-run that carries its original's obligation."""
    return ticket.parent_id is None or (
        ticket.rerun_of_id is not None and ticket.obligation_state != ObligationState.NONE
    )


def _open_delivery(ticket: Ticket, rerun: uuid.UUID | None) -> dict[str, str] | None:
    """The delivery of a root ticket (or of a re-run, which answers its
    original's requester), opened in the terminal transition's transaction so
    it is never lost; what the terminal event records of it, or None when it
    opens none (a child; an original superseded by a re-run, whose
    obligation passes to the re-run; a delivery already open)."""
    from . import delivery  # noqa: PLC0415 - same app, avoids a cycle

    if rerun is not None or not _root_like(ticket):
        return None
    return delivery.on_root_terminal(ticket=ticket)[1]


def _on_terminal(ticket: Ticket, rerun: uuid.UUID | None) -> None:
    """The other hooks of a terminal transition, in its transaction: the
    callback to ``return_to``, and the obligation of an original superseded
    by a re-run, which passes to the re-run. All idempotent."""
    from . import callbacks  # noqa: PLC0415 - same app, avoids a cycle

    ticket_id = ticket.id
    if ticket.return_to_id is not None and ticket.callback_state == CallbackState.PENDING:
        if rerun is None:
            callbacks.ensure_callback(source_id=ticket_id)
        else:
            # DESIGN.md flow 7: the re-run's terminal state sends the one
            # callback for this child, under this child's key; nothing now.
            update_fields(
                ticket_id=ticket_id,
                kind="callback_passed",
                actor="recovery",
                detail={"rerun": str(rerun)},
                callback_state=CallbackState.NONE,
            )
    if rerun is not None and _root_like(ticket) and ticket.obligation_state == ObligationState.OPEN:
        update_fields(
            ticket_id=ticket_id,
            kind="obligation_passed",
            actor="recovery",
            detail={"rerun": str(rerun)},
            obligation_state=ObligationState.CLOSED,
            obligation_note=f"superseded by re-run {rerun}, which answers the requester",
        )


def cancel_ticket(*, ticket_id: uuid.UUID, actor: str, reason: str = "") -> Ticket:
    """``queued | waiting -> cancelled``; a running ticket gets an interrupt
    request and becomes cancelled when its turn is proven stopped. A
    ``reason`` (the console asks for one) is kept in the event's detail."""
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
                error={"code": "cancelled", "detail": f"cancelled by {actor}"},
            )
        elif ticket.state == TicketState.RUNNING:
            if ticket.cancel_requested_at is None:
                update_fields(
                    ticket_id=ticket_id,
                    kind="cancel_requested",
                    actor=actor,
                    detail=why,
                    cancel_requested_at=timezone.now(),
                )
                # The runtime stops the turn (tickets/ports.py: tickets never
                # imports endpoints); the ticket is cancelled when the stop is proven.
                endpoint_directory().request_interrupt(
                    turn_id=ticket.turn_id, reason="cancel", actor=actor
                )
        else:
            raise InvalidTransition(
                f"ticket {ticket_id} is {ticket.state}: only queued, waiting or running "
                "tickets can be cancelled",
                state=ticket.state,
            )
    return Ticket.objects.get(id=ticket_id)
