"""The rules the PL/pgSQL functions and the Python services share, each one
SQL function (tickets/sql/) that Python reads through tickets/rules.py:
"may start" (an endpoint available and not paused) and "root-like" (a
ticket that answers a requester)."""

from __future__ import annotations

import pytest
from django.db import connection

from endpoints.models import Endpoint
from runtime import turns as runtime
from runtime.runners import Outcome
from runtime.services import cancel_ticket, pause_endpoint
from tickets import terminal
from tickets.admission import admit_ticket
from tickets.models import Ticket
from tickets.rules import EndpointMayStart, RootLike

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("state", "paused", "may"),
    [("available", False, True), ("available", True, False), ("quarantined", False, False)],
)
def test_may_start_is_one_function(state, paused, may):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT claimcheck_endpoint_may_start(p_state => %s,"
            " p_paused_at => CASE WHEN %s THEN now() END)",
            [state, paused],
        )
        assert cur.fetchone() == (may,)


def test_python_reads_may_start_from_the_function_and_it_is_inlined(make_endpoint, staff_user):
    make_endpoint("rules.open")
    make_endpoint("rules.paused")
    pause_endpoint(address="rules.paused", user=staff_user, reason="a rule's test")
    ours = Endpoint.objects.filter(address__startswith="rules.")
    may = ours.alias(ok=EndpointMayStart()).filter(ok=True)
    assert list(may.values_list("address", flat=True)) == ["rules.open"]
    sql, params = may.query.sql_with_params()
    assert "claimcheck_endpoint_may_start(p_state => " in sql
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (VERBOSE) " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    # Inlined: the planner sees the columns, not a call.
    assert "claimcheck_endpoint_may_start" not in plan and "paused_at IS NULL" in plan, plan


def test_python_reads_root_like_from_the_function(make_endpoint):
    make_endpoint("rules.root")
    root = admit_ticket(endpoint="rules.root", input={"n": 1}).ticket
    ticket, rerun = terminal.context(root.id)
    assert ticket.root_like is True and rerun is None
    assert Ticket.objects.alias(r=RootLike()).filter(id=root.id, r=True).exists()


def test_a_cancel_writes_one_error_text_whichever_way_it_went(make_endpoint):
    """At once (queued) and once the running turn is proven stopped (the
    finish): the same ``claimcheck_ticket_cancelled_error``."""
    make_endpoint("rules.cancel")
    running = admit_ticket(endpoint="rules.cancel", input={"n": 1}).ticket
    queued = admit_ticket(endpoint="rules.cancel", input={"n": 2}).ticket
    started = runtime.start_turn(ticket_id=running.id)
    assert started is not None and started.ticket.id == running.id
    cancel_ticket(ticket_id=queued.id, actor="user:q")
    cancel_ticket(ticket_id=running.id, actor="user:r")
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.stopped("process_exit", {"signals_sent": ["SIGTERM"]}),
        source="test",
    )
    for ticket, actor in ((queued, "user:q"), (running, "user:r")):
        ticket.refresh_from_db()
        assert ticket.state == "cancelled"
        assert ticket.error == {"code": "cancelled", "detail": f"cancelled by {actor}"}
