"""What a terminal state owes, decided in one place and in the terminal
transition's transaction: the delivery of a root ticket (or of a re-run that
answers its original's requester), the callback a child owes its parent, and
an obligation passed to the re-run that supersedes an original. Called by
``lifecycle.transition`` on a terminal edge and, for a turn's finish (whose
database function opens the delivery itself), by ``after_terminal``."""

from __future__ import annotations

import uuid

from . import callbacks, delivery
from .events import update_fields
from .models import CallbackState, ObligationState, Ticket, TicketState
from .rules import RootLike


def context(ticket_id: uuid.UUID) -> tuple[Ticket, uuid.UUID | None]:
    """The ticket that just became terminal (with ``root_like``: the rule is
    the database's, tickets/rules.py), and the re-run that supersedes it, if
    any."""
    ticket = (
        Ticket.objects.select_related("endpoint").annotate(root_like=RootLike()).get(id=ticket_id)
    )
    # Only an orphaned ticket can have been superseded by a re-run (admitted
    # in the same decision, before this transition).
    rerun = (
        Ticket.objects.filter(rerun_of_id=ticket_id).values_list("id", flat=True).first()
        if ticket.state == TicketState.ORPHANED
        else None
    )
    return ticket, rerun


def open_delivery(ticket: Ticket, rerun: uuid.UUID | None) -> dict[str, str] | None:
    """The delivery of a root ticket (or of a re-run, which answers its
    original's requester), opened in the terminal transition's transaction so
    it is never lost; what the terminal event records of it, or None when it
    opens none (a child; an original superseded by a re-run, whose
    obligation passes to the re-run; a delivery already open)."""
    if rerun is not None or not ticket.root_like:
        return None
    return delivery.on_root_terminal(ticket=ticket)[1]


def on_terminal(ticket: Ticket, rerun: uuid.UUID | None) -> None:
    """The other hooks of a terminal transition, in its transaction: the
    callback to ``return_to``, and the obligation of an original superseded
    by a re-run, which passes to the re-run. All idempotent."""
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
    if rerun is not None and ticket.root_like and ticket.obligation_state == ObligationState.OPEN:
        update_fields(
            ticket_id=ticket_id,
            kind="obligation_passed",
            actor="recovery",
            detail={"rerun": str(rerun)},
            obligation_state=ObligationState.CLOSED,
            obligation_note=f"superseded by re-run {rerun}, which answers the requester",
        )


def after_terminal(*, ticket_id: uuid.UUID) -> None:
    """The hooks of a terminal transition that ``lifecycle.transition`` did not make
    (a turn's finish, ``claimcheck_finish_turn``, which opens the delivery
    itself): the callback a child owes its parent. In the caller's
    transaction, which holds the ticket row."""
    on_terminal(*context(ticket_id))
