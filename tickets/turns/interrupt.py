"""A turn asked to stop, and a ticket's cancel (which asks its running turn
to stop): the ledger's records of both, in one transaction.

``running -> interrupting`` is a transition of the ledger's turn; what
makes the turn actually stop is the runtime's (the worker's heartbeat sees
the flag, a command's process group is signalled by its runner, an http
agent is asked through its cancel URL). The runtime registers that last
step here at start-up (``RuntimeConfig.ready``), as it registers the busy
policy's supersede (tickets/superseding.py): the ledger sits below it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from django.db import transaction
from django.db.models.functions import Now

from .. import lifecycle
from ..models import Ticket, Turn, TurnState

log = logging.getLogger(__name__)

# Called in the interrupting transaction with the turn just flagged (its
# endpoint loaded); schedules its own I/O after commit.
Interrupted = Callable[[Turn], None]

_on_interrupt: list[Interrupted] = []


def on_interrupt(hook: Interrupted) -> None:
    """Register the runtime's step of an interrupt (once per hook)."""
    if hook not in _on_interrupt:
        _on_interrupt.append(hook)


def request_interrupt(
    *,
    turn_id: uuid.UUID | None,
    reason: str,
    actor: str,
    seq: int | None = None,
    detail: dict | None = None,
) -> bool:
    """``running -> interrupting`` for one exact turn (and, given ``seq``, only
    while the turn carries that fencing token), with its
    ``interrupt_requested`` event; then the runtime's step (``on_interrupt``).
    ``detail`` joins the event's (a supersede's ``by``, which the finish
    copies into the ticket's error). Returns False when the turn was not
    running (another sweeper, or the turn's own worker, got there first)."""
    if turn_id is None:
        return False
    exact = {"seq": seq} if seq is not None else {}
    with transaction.atomic():
        # The database's clock, like the turn's started_at: a late outcome is
        # judged by comparing the two (docs/explanation/design.md, "A late outcome").
        updated = Turn.objects.filter(id=turn_id, state=TurnState.RUNNING, **exact).update(
            state=TurnState.INTERRUPTING, interrupt_requested_at=Now(), interrupt_reason=reason
        )
        if not updated:
            return False
        turn = Turn.objects.select_related("endpoint").get(id=turn_id)
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="interrupt_requested",
            actor=actor,
            turn_id=turn.id,
            detail={
                **(detail or {}),
                "seq": turn.seq,
                "reason": reason,
                "grace_s": turn.endpoint.interrupt_grace_s,
            },
        )
        for hook in _on_interrupt:
            hook(turn)
    log.warning("interrupt requested for turn %s (%s)", turn_id, reason)
    return True


def cancel_ticket(*, ticket_id: uuid.UUID, actor: str, reason: str = "") -> Ticket:
    """``queued | waiting -> cancelled`` (``tickets.lifecycle.request_cancel``);
    a running ticket is marked cancel-requested and its turn gets an
    interrupt request, in the same transaction; the ticket becomes
    cancelled when its turn is proven stopped. A ``reason`` (the console
    asks for one) is kept in the event's detail. The one cancel of the API
    (``POST /tickets/{id}/cancel``), the MCP tool and the console."""
    with transaction.atomic():
        interrupt = lifecycle.request_cancel(ticket_id=ticket_id, actor=actor, reason=reason)
        if interrupt is not None:
            request_interrupt(turn_id=interrupt, reason="cancel", actor=actor)
    return Ticket.objects.get(id=ticket_id)
