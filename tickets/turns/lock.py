"""The endpoint lock's release and the endpoint's next ticket: the calls of
claimcheck_release_lock and claimcheck_next_ticket (tickets/sql/), which a
turn's finish runs too, so each step is written in one place.

Each answers the ticket the function unmarked for its message (None: none
was marked); publishing it, or waking the dispatcher, is the caller's
(runtime.turns.dispatch)."""

from __future__ import annotations

import uuid

from core.sqlfunctions import call_cursor


def release_lock(*, endpoint_id: int, turn_id: uuid.UUID) -> uuid.UUID | None:
    """Release the lock ``turn_id`` holds (the caller holds the lock row) and
    unmark the endpoint's next ticket. Raises when the turn does not hold
    the lock (the caller checked: a bug)."""
    with call_cursor() as cur:
        cur.execute(
            "SELECT claimcheck_release_lock(p_endpoint => %s, p_turn => %s) AS next_ticket",
            [endpoint_id, turn_id],
        )
        return cur.fetchone()[0]


def next_ticket(*, endpoint_id: int) -> uuid.UUID | None:
    """After a release (the caller holds the lock row): unmark the oldest
    queued ticket of the endpoint that has no message in flight."""
    with call_cursor() as cur:
        cur.execute("SELECT claimcheck_next_ticket(p_endpoint => %s) AS next_ticket", [endpoint_id])
        return cur.fetchone()[0]
