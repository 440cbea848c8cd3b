"""The ticket's state machine as the database enforces it (core/edges.py):
``TICKET_EDGES`` is its one source, ``tickets/sql/claimcheck_ticket_*`` are
generated from it."""

from __future__ import annotations

from pathlib import Path

from core.edges import Machine

from .models import TICKET_EDGES, TicketState

SQL = Path(__file__).parent / "sql"

TICKET = Machine(
    name="ticket",
    table="tickets_ticket",
    edges=TICKET_EDGES,
    source="tickets/models.py TICKET_EDGES",
    # An admission's event records '' -> queued; no row is ever updated to it.
    births=(TicketState.QUEUED,),
)
