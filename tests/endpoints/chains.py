"""What the ledger says about turns a finish started (runtime.finish_turn
with ``start_next``)."""

from __future__ import annotations

from django.db import connection


def started_in_a_finish(ids) -> list:
    """The tickets among ``ids`` whose turn_started event was written by the
    transaction that wrote another ticket's turn_completed event (events are
    only ever inserted, so an event's xmin is the transaction that wrote it)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT s.ticket_id FROM tickets_ticketevent s"
            " JOIN tickets_ticketevent f ON f.xmin::text = s.xmin::text"
            "  AND f.kind = 'turn_completed' AND f.ticket_id <> s.ticket_id"
            " WHERE s.kind = 'turn_started' AND s.ticket_id = ANY(%s) ORDER BY s.ticket_id",
            [list(ids)],
        )
        return [row[0] for row in cur.fetchall()]
