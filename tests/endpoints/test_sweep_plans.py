"""The sweeps read only active rows through partial indexes, so their cost
follows the number of running turns and queued tickets, not the ledger."""

from __future__ import annotations

import pytest
from django.db import connection

from tickets.models import TURN_ACTIVE_STATES, Ticket, TicketState, Turn

pytestmark = pytest.mark.django_db


def plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cur:
        # Small test tables would be scanned sequentially anyway; forbid it to
        # see which index the planner can use for this exact query.
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_budget_sweep_query_uses_the_active_turn_partial_index():
    text = plan(Turn.objects.filter(state__in=TURN_ACTIVE_STATES))
    assert "turn_active_deadline_idx" in text, text


def test_dispatch_query_uses_the_queued_partial_index():
    text = plan(
        Ticket.objects.filter(endpoint_id=1, state=TicketState.QUEUED).order_by("id").values("id")
    )
    assert "ticket_queued_idx" in text, text
