"""The turn runtime: start, heartbeat, finish and interrupt exact turns; the
sweeps that enforce budgets and re-dispatch lost work; quarantine.

One module for each part of a turn's life (docs/explanation/design.md, "The runtime"):

- ``start``      the lock row, the fencing token, the Turn row; ``queued -> running``
- ``heartbeats`` liveness of a running turn, and the worker's heartbeat thread
- ``execute``    what the worker does with a message: start, run the runner, finish
- ``finish``     the exact turn's outcome applied, or refused as stale
- ``dispatch``   one broker message per turn: ``needs_dispatch``, release, the next
  ticket, the lost-dispatch sweep
- ``budgets``    interrupts, the worker's own enforcement of a budget, the budget sweep
- ``quarantine`` turn uncertain, ticket recovering, endpoint quarantined; leaving it
- ``evidence``   late or foreign outcomes recorded, never applied
- ``sweeplock``  one sweeper of each kind at a time

Lock order, everywhere, to rule out deadlocks:
``EndpointLock`` before a queued ticket in ``start_turn``; otherwise
``Ticket -> EndpointLock -> Turn -> Endpoint``. No I/O while a lock is held:
runners, agent cancels and broker publishes happen outside transactions.

Callers outside the package use only the names exported here.
"""

from __future__ import annotations

from tickets.turns.start import Started, start_turn, turn_token_sha256

from ..runners import Outcome, TurnContext
from .budgets import (
    BudgetWatch,
    SweepReport,
    request_interrupt,
    supersede_turn,
    sweep_budgets,
    sweep_trace_budgets,
)
from .dispatch import dispatch_next, dispatch_owed, release_lock, sweep_lost_dispatches
from .execute import HISTORY_ENTRIES, current_turns, run_ticket
from .finish import Finished, finish_turn, outcome_digest
from .heartbeats import HeartbeatState, heartbeat
from .quarantine import quarantine_turn, resolve_uncertain_turn

__all__ = [
    "HISTORY_ENTRIES",
    "BudgetWatch",
    "Finished",
    "HeartbeatState",
    "Outcome",
    "Started",
    "SweepReport",
    "TurnContext",
    "current_turns",
    "dispatch_next",
    "dispatch_owed",
    "finish_turn",
    "heartbeat",
    "outcome_digest",
    "quarantine_turn",
    "release_lock",
    "request_interrupt",
    "resolve_uncertain_turn",
    "run_ticket",
    "start_turn",
    "supersede_turn",
    "sweep_budgets",
    "sweep_trace_budgets",
    "sweep_lost_dispatches",
    "turn_token_sha256",
]
