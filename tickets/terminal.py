"""What a ticket's move leaves to Python, in one place for both writers of
a move: ``lifecycle.transition`` (``claimcheck_ticket_move``) and a turn's
finish (``claimcheck_finish_turn``, runtime/turns/finish.py).

The database does every duty it can in the move's own statement
(tickets/sql/claimcheck_ticket_move.sql): the conditional state change,
its event, the delivery a terminal ticket that answers a requester owes
(``claimcheck_ticket_owes``: the one home of "owes a delivery"), and what
an orphan superseded by a re-run passes to it. What needs the process is
here, called in the move's transaction right after the function: the
delivery's send published and the watchers woken once it commits, the
callback a child owes its parent admitted (an admission, Python's:
``callbacks.ensure_callback``, the one home of "owes a callback"), and the
transition counted at commit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from core import observe
from core.dispatch import DELIVER, publish

from . import callbacks, waits
from .models import TERMINAL_STATES


@dataclass(frozen=True)
class Moved:
    """What a move reports of its duties (the function's columns, read by
    name): the delivery it opened and whether its send is due now, and
    whether the ticket reports to a parent's endpoint (``return_to``)."""

    delivery: uuid.UUID | None
    due: bool
    reports: bool


def after_move(
    *,
    ticket_id: uuid.UUID,
    expected: str,
    to: str,
    kind: str,
    turn_id: uuid.UUID | None,
    moved: Moved,
) -> None:
    """The Python duties of a move that committed with the caller's
    transaction (the ticket's row is the caller's)."""
    waits.notify_changed(ticket_id)
    if moved.due:
        publish(DELIVER, str(moved.delivery))
    if moved.reports and to in TERMINAL_STATES:
        callbacks.ensure_callback(source_id=ticket_id)
    # Metrics at commit; a turn's ids for the worker's log lines.
    observe.transition(
        ticket_id=ticket_id, expected=expected, to=to, kind=kind, turn_id=turn_id, fields={}
    )
