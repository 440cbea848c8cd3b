"""Ticket transitions after admission.

Every transition is one call of ``claimcheck_ticket_move``
(tickets/sql/claimcheck_ticket_move.sql), inside the caller's transaction
when there is one: the conditional state change (``WHERE state =
expected``), its event, and what the new state owes that the database can
do (a terminal ticket's delivery, an orphan's obligations passed to its
re-run). A ticket found in another state means another process got there
first: the transition raises ``InvalidTransition`` naming the state it
found, and writes nothing. A turn's finish writes its move from the same
parts (``claimcheck_finish_turn``). What is left to Python (the
delivery's send, a callback's admission, the wake, the metrics) is
``tickets/terminal.py``'s ``after_move``, for both; the events of a
ticket's other fields are ``tickets/events.py``'s.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.errors import InvalidTransition, NotFound
from core.ids import new_id
from core.sqlfunctions import call_cursor

from . import terminal as terminal_hooks
from .events import append_event, update_fields
from .models import TICKET_EDGES, Ticket, TicketState

log = logging.getLogger(__name__)

# Named arguments (a parameter added with a default shifts no caller); the
# result read by column name (MOVED_COLUMNS).
MOVED_COLUMNS = ("o_moved", "o_state", "o_delivery", "o_due", "o_reports")
_MOVE_SQL = (
    "SELECT " + ", ".join(f"m.{c}" for c in MOVED_COLUMNS) + " FROM claimcheck_ticket_move("
    "p_ticket => %(ticket)s, p_expected => %(expected)s, p_to => %(to)s, p_kind => %(kind)s,"
    " p_actor => %(actor)s, p_turn => %(turn)s, p_detail => %(detail)s::jsonb,"
    " p_now => %(now)s, p_delivery => %(delivery)s, p_error => %(error)s::jsonb,"
    " p_result => %(result)s::jsonb, p_artifacts => %(artifacts)s::jsonb,"
    " p_completed_by_turn => %(completed_by_turn)s) m"
)


def _json(value: Any) -> str | None:
    # NULL leaves the field as it is (the function's rule).
    return None if value is None else json.dumps(value)


def transition(
    *,
    ticket_id: uuid.UUID,
    expected: str,
    to: str,
    kind: str,
    actor: str,
    turn_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    result: Any = None,
    artifacts: list | None = None,
    completed_by_turn: Any = None,
) -> str:
    """Move a ticket from ``expected`` to ``to``; returns the prior state.

    Refuses edges the state machine does not have (a programming error) and
    a prior state that does not match (a race lost): both write nothing.
    The fields a move may carry: ``error`` (a cancel given none gets the one
    cancel text, ``claimcheck_ticket_cancelled_error``), ``result`` and
    ``artifacts``, ``completed_by_turn`` (a turn or its id); None leaves a
    field as it is.
    """
    expected, to = str(expected), str(to)
    if to not in TICKET_EDGES[expected]:
        raise ValueError(f"no edge {expected} -> {to} in the ticket state machine")
    params = {
        "ticket": ticket_id,
        "expected": expected,
        "to": to,
        "kind": kind,
        "actor": actor,
        "turn": turn_id,
        "detail": json.dumps(detail or {}),
        "now": timezone.now(),
        "delivery": new_id(),
        "error": _json(error),
        "result": _json(result),
        "artifacts": _json(artifacts),
        "completed_by_turn": getattr(completed_by_turn, "pk", completed_by_turn),
    }
    # savepoint=False: a refused transition raises before writing anything,
    # and every caller lets the error end its transaction (no savepoint
    # round trips on the hot path).
    with transaction.atomic(savepoint=False):
        with call_cursor() as cur:
            cur.execute(_MOVE_SQL, params)
            row = cur.fetchone()
            names = tuple(column.name for column in cur.description)
        assert names == MOVED_COLUMNS, names  # the SELECT list above
        moved, found, delivery, due, reports = row
        if not moved:
            if found is None:
                raise NotFound(f"ticket {ticket_id} not found")
            raise InvalidTransition(
                f"ticket {ticket_id} is {found}; {kind} needs {expected}", state=found
            )
        terminal_hooks.after_move(
            ticket_id=ticket_id,
            expected=expected,
            to=to,
            kind=kind,
            turn_id=turn_id,
            moved=terminal_hooks.Moved(delivery=delivery, due=due, reports=reports),
        )
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
                # No error given: the move writes the one cancel text
                # (claimcheck_ticket_cancelled_error), as the finish of a
                # running ticket's stopped turn does.
                detail=why,
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
    "transition",
    "update_fields",
]
