"""The turn's state machine (DESIGN.md: ``running -> completed | failed |
interrupting -> stopped | uncertain``) as the database enforces it
(core/edges.py): ``TURN_EDGES`` is its one source,
``runtime/sql/claimcheck_turn_*`` are generated from it."""

from __future__ import annotations

from pathlib import Path

from core.edges import Machine

from .models import TurnState

SQL = Path(__file__).parent / "sql"

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
    name="turn", table="runtime_turn", edges=TURN_EDGES, source="runtime/machines.py TURN_EDGES"
)
