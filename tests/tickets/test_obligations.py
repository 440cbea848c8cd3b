"""The overdue sweep (tickets.obligations): flags each past-due open
obligation once, and costs nothing for obligations it flagged long ago."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from tickets import obligations
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketEvent

pytestmark = pytest.mark.django_db


def _plan_nodes(queryset) -> list[dict]:
    plan = json.loads(queryset.explain(format="json", analyze=True))
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return nodes


def test_an_idle_pass_reads_none_of_the_obligations_it_flagged_before(
    make_endpoint, owner_cursor, settings
):
    """Found by bench/scale.py: a result nobody pulls keeps its obligation
    open, flagged, for good, and the idle pass read every one, so it slowed
    as the ledger grew. The sweep's own partial index holds only what it may
    still flag."""
    settings.OBLIGATION_UPDATE_INTERVAL_S = 0  # due at once
    make_endpoint("owed")
    tickets = [admit_ticket(endpoint="owed", input={"i": i}).ticket for i in range(300)]
    flagged = obligations.sweep_overdue(limit=1000)
    assert sorted(flagged) == sorted(t.id for t in tickets)
    assert TicketEvent.objects.filter(kind="obligation_overdue").count() == 300
    assert Ticket.objects.filter(obligation_state="open", obligation_overdue=True).count() == 300

    owner_cursor.execute("ANALYZE tickets_ticket")  # the application role may not
    nodes = _plan_nodes(obligations.overdue_unflagged(timezone.now()))
    removed = sum(node.get("Rows Removed by Filter", 0) for node in nodes)
    assert removed == 0 and not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
    assert obligations.sweep_overdue() == []  # flagged once: no second event
    assert TicketEvent.objects.filter(kind="obligation_overdue").count() == 300
