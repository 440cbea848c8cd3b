"""The ticket's and the turn's state machines as the database enforces them
(core/edges.py): ``TICKET_EDGES`` and ``TURN_EDGES`` are their one source,
``tickets/sql/claimcheck_ticket_*`` and ``claimcheck_turn_*`` are generated
from them (``manage.py generate_edges``). The turn's (DESIGN.md:
``running -> completed | failed | interrupting -> stopped | uncertain``)."""

from __future__ import annotations

from pathlib import Path

from core.edges import Machine

from .models import TICKET_EDGES, TicketState, TurnState

SQL = Path(__file__).parent / "sql"

TICKET = Machine(
    name="ticket",
    table="tickets_ticket",
    edges=TICKET_EDGES,
    source="tickets/models.py TICKET_EDGES",
    # An admission's event records '' -> queued; no row is ever updated to it.
    births=(TicketState.QUEUED,),
)

TURN_EDGES: dict[str, frozenset[str]] = {
    # A runner's outcome (completed, failed), its stop evidence without an
    # interrupt (stopped), a budget's or a cancel's interrupt, a process
    # that died with side effects in doubt (uncertain).
    TurnState.RUNNING: frozenset(
        {
            TurnState.COMPLETED,
            TurnState.FAILED,
            TurnState.STOPPED,
            TurnState.INTERRUPTING,
            TurnState.UNCERTAIN,
        }
    ),
    # Stopped as asked; a late outcome returned before the interrupt
    # (completed, failed); no stop evidence within the grace (uncertain).
    TurnState.INTERRUPTING: frozenset(
        {TurnState.STOPPED, TurnState.COMPLETED, TurnState.FAILED, TurnState.UNCERTAIN}
    ),
    # Left only by an owner's decision: with stop evidence, or without.
    TurnState.UNCERTAIN: frozenset({TurnState.STOPPED, TurnState.UNRESOLVED}),
    TurnState.COMPLETED: frozenset(),
    TurnState.FAILED: frozenset(),
    TurnState.STOPPED: frozenset(),
    TurnState.UNRESOLVED: frozenset(),
}

TURN = Machine(
    name="turn", table="runtime_turn", edges=TURN_EDGES, source="tickets/machines.py TURN_EDGES"
)
