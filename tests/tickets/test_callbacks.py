"""Children, callbacks and the circuit breaker: demo.research through a real
worker, concurrent callbacks converging on real PostgreSQL, refused callbacks
retried by the sweep, and the trace limits."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import override_settings

from runtime import services as runtime_services
from tests.conftest import wait_for
from tickets import callbacks, tasks
from tickets.models import Callback, LedgerEvent, Ticket, TicketEvent, Trace, Turn

pytestmark = pytest.mark.django_db

TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")


# --- demo.research through a real worker ---------------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_research_with_three_children_completes_through_callbacks(api, make_endpoint, worker):
    make_endpoint("demo.echo")
    make_endpoint("demo.research", path="runtime.demo.research")
    resp = api.post("/tickets", {"endpoint": "demo.research", "input": {"children": 3}})
    assert resp.status_code == 201, resp.content
    root_id = resp.json()["id"]

    def finished():
        t = api.get(f"/tickets/{root_id}").json()
        return t if t["state"] in TERMINAL else None

    parent = wait_for(finished, timeout=60, message="the research ticket to finish")
    assert parent["state"] == "succeeded", (parent, worker.log("turns")[-3000:])

    children = list(Ticket.objects.filter(parent_id=root_id, callback_for__isnull=True))
    assert len(children) == 3
    assert {c.state for c in children} == {"succeeded"}
    assert {c.endpoint.address for c in children} == {"demo.echo"}
    listed = parent["result"]["children"]
    assert sorted(c["id"] for c in listed) == sorted(str(c.id) for c in children)
    assert all(c["state"] == "succeeded" and c["result"]["echo"]["topic"] == "demo" for c in listed)

    # Every child's callback is recorded once its callback ticket's turn ran
    # (the callbacks after the one that resumed the parent may still be running).
    def recorded():
        states = list(
            Ticket.objects.filter(parent_id=root_id, callback_for__isnull=True).values_list(
                "callback_state", flat=True
            )
        )
        return states if set(states) == {"recorded"} else None

    wait_for(recorded, timeout=30, message="every child's callback to be recorded")
    for child in children:
        cb = Callback.objects.get(source=child)
        assert cb.ticket.callback_for_id == child.id and cb.ticket.parent_id == child.id
        assert cb.ticket.endpoint.address == "demo.research"
        assert cb.ticket.trace_id == child.trace_id == parent["trace_id"]
        cb_view = api.get(f"/tickets/{child.id}").json()["callback"]
        assert cb_view == {"state": "recorded", "ticket": str(cb.ticket_id)}

    # The parent is attributed to the turn of the callback ticket that resumed it.
    root = Ticket.objects.get(id=root_id)
    resumed = TicketEvent.objects.get(ticket_id=root_id, kind="resumed")
    assert root.completed_by_turn_id is not None
    assert root.completed_by_turn_id == resumed.turn_id
    resuming_turn = Turn.objects.get(id=root.completed_by_turn_id)
    callback_tickets = set(
        Callback.objects.filter(source__in=children).values_list("ticket_id", flat=True)
    )
    assert resuming_turn.ticket_id in callback_tickets
    assert root.completed_by_turn_id != root.turn_id  # not the turn that dispatched
    assert parent["completed_by_turn"] == str(root.completed_by_turn_id)
    # 1 root + 3 children + 3 callbacks on one trace, counted by the breaker.
    assert Trace.objects.get(id=parent["trace_id"]).tickets == 7
    kinds = list(LedgerEvent.objects.filter(ticket_id=root_id).values_list("kind", flat=True))
    assert kinds[:3] == ["admitted", "turn_started", "waiting_for_children"]
    # Callbacks that ran before every child was done left it waiting; one resumed it.
    between = kinds[3 : kinds.index("resumed")]
    assert set(between) <= {"still_waiting"} and len(between) <= 2
    assert kinds.count("resumed") == 1
    assert parent["delivery"]["state"] == "pending"  # a root: its pull delivery is open


# --- Convergence ---------------------------------------------------------------------------


def root_and_child(api, endpoint: str) -> tuple[dict, dict]:
    """A root ticket and its child returning to the same endpoint, both queued."""
    root = api.post("/tickets", {"endpoint": endpoint, "input": {}}).json()
    body = {
        "endpoint": endpoint,
        "input": {},
        "parent": root["id"],
        "return_to": {"endpoint": endpoint},
    }
    return root, api.post("/tickets", body).json()


def refused_callback(api, make_endpoint) -> Ticket:
    """A finished child whose callback the circuit breaker refused: its
    callback state stays ``pending`` and no Callback exists."""
    make_endpoint("alpha")
    make_endpoint("home")
    root = api.post("/tickets", {"endpoint": "home", "input": {}}).json()
    with override_settings(TRACE_SOFT_LIMIT=1, TRACE_HARD_LIMIT=2):
        child = api.post(
            "/tickets",
            {
                "endpoint": "alpha",
                "input": {"part": 1},
                "parent": root["id"],
                "return_to": {"endpoint": "home", "continuation": {"step": 1}},
            },
        )
        assert child.status_code == 201, child.content
        source_id = child.json()["id"]
        runtime_services.cancel_ticket(ticket_id=source_id, actor="test")  # terminal: callback due
        callbacks.retry_pending_callbacks()  # refused again: no second event
    source = Ticket.objects.get(id=source_id)
    assert source.state == "cancelled" and source.callback_state == "pending"
    assert not Callback.objects.filter(source=source).exists()
    refusals = TicketEvent.objects.filter(ticket=source, kind="callback_refused")
    assert [e.detail["error"] for e in refusals] == ["circuit_open"]
    return source


@pytest.mark.django_db(transaction=True)
def test_concurrent_callbacks_converge_on_one_callback_ticket(api, make_endpoint):
    source = refused_callback(api, make_endpoint)
    n = 8
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def drive(i: int) -> None:
        try:
            barrier.wait()
            cb = callbacks.ensure_callback(source_id=source.id)
            results[i] = (cb.id, cb.ticket_id)
        except Exception as exc:  # surfaced below
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, tuple) for r in results), results
    assert len(set(results)) == 1
    assert Callback.objects.filter(source=source).count() == 1
    made = Ticket.objects.filter(callback_for=source)
    assert made.count() == 1
    cb_ticket = made.get()
    assert cb_ticket.dedupe_key == callbacks.callback_key(source.id)
    assert cb_ticket.endpoint.address == "home" and cb_ticket.parent_id == source.id
    assert cb_ticket.input["callback"]["source"] == str(source.id)
    assert cb_ticket.input["callback"]["state"] == "cancelled"
    assert cb_ticket.input["callback"]["continuation"] == {"step": 1}
    source.refresh_from_db()
    assert source.callback_state == "accepted"
    assert TicketEvent.objects.filter(ticket=source, kind="callback_accepted").count() == 1


def test_the_obligations_sweep_retries_a_refused_callback(api, make_endpoint):
    source = refused_callback(api, make_endpoint)
    tasks.sweep_obligations()  # default limits: the trace has room again
    source.refresh_from_db()
    assert source.callback_state == "accepted"
    assert Callback.objects.filter(source=source).count() == 1
    tasks.sweep_obligations()  # nothing pending: nothing more
    assert Ticket.objects.filter(callback_for=source).count() == 1


def test_ensure_callback_ignores_a_ticket_without_return_to_or_not_finished(api, make_endpoint):
    make_endpoint("alpha")
    plain = api.post("/tickets", {"endpoint": "alpha", "input": {}}).json()
    runtime_services.cancel_ticket(ticket_id=plain["id"], actor="test")
    assert callbacks.ensure_callback(source_id=plain["id"]) is None
    root, child = root_and_child(api, "alpha")
    assert callbacks.ensure_callback(source_id=child["id"]) is None  # still queued
    assert Callback.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_finish_admits_its_callback_in_its_own_transaction_without_savepoints(api, make_endpoint):
    """The callback is admitted in the finishing transaction (one BEGIN, one
    COMMIT) and nothing in it needs a savepoint: the admission is one
    statement whose refusal is an answer, not a database error, and nothing
    catches a database error to go on, so a savepoint would only add round
    trips (bench/costs.py: a callback's statements)."""
    import uuid

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runtime.turns import run_ticket

    make_endpoint("alpha")
    root, child = root_and_child(api, "alpha")
    # The root's turn first (the endpoint runs its oldest ticket first).
    run_ticket(ticket_id=uuid.UUID(root["id"]))
    with CaptureQueriesContext(connection) as queries:
        run_ticket(ticket_id=uuid.UUID(child["id"]))
    source = Ticket.objects.get(id=child["id"])
    assert source.callback_state == "accepted"
    assert Callback.objects.filter(source=source).count() == 1
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sql if "SAVEPOINT" in q], sql
    assert sum(q == "BEGIN" for q in sql) == 1 and sum(q == "COMMIT" for q in sql) == 1, sql


# --- Circuit breaker -----------------------------------------------------------------------


@override_settings(TRACE_SOFT_LIMIT=2, TRACE_HARD_LIMIT=4)
def test_a_chain_past_the_hard_limit_is_refused_and_the_soft_limit_warns(api, make_endpoint):
    make_endpoint("alpha")
    chain = [api.post("/tickets", {"endpoint": "alpha", "input": {}}).json()]
    for depth in range(1, 4):
        resp = api.post(
            "/tickets", {"endpoint": "alpha", "input": {"d": depth}, "parent": chain[-1]["id"]}
        )
        assert resp.status_code == 201, resp.content
        assert resp.json()["depth"] == depth
        chain.append(resp.json())
    trace_id = chain[0]["trace_id"]

    refused = api.post(
        "/tickets", {"endpoint": "alpha", "input": {"d": 4}, "parent": chain[-1]["id"]}
    )
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"] == "circuit_open"
    assert refused.json()["trace_id"] == trace_id and refused.json()["limit"] == 4
    assert Ticket.objects.filter(trace_id=trace_id).count() == 4  # nothing half-written
    assert Trace.objects.get(id=trace_id).tickets == 4

    # The soft limit warned once, on the ticket that passed it (the third).
    warned = TicketEvent.objects.filter(kind="trace_soft_limit")
    assert [str(e.ticket_id) for e in warned] == [chain[2]["id"]]
    assert warned.get().detail == {"trace_id": trace_id, "tickets": 3, "soft_limit": 2}
    assert Trace.objects.get(id=trace_id).flagged is True

    # A dedupe hit on the full trace is still answered: it adds no ticket.
    again = api.post(
        "/tickets", {"endpoint": "alpha", "input": {"d": 4}, "parent": chain[-1]["id"]}
    )
    assert again.status_code == 429
    other = api.post("/tickets", {"endpoint": "alpha", "input": {}})
    assert other.status_code == 201  # a new trace is not affected


@pytest.mark.django_db(transaction=True)
def test_the_pending_callback_sweep_reads_only_pending_callbacks(make_endpoint, owner_cursor):
    """Found by bench/scale.py: the sweep read the whole ticket table on
    every pass, a cost that grows with the ledger. A partial index holds
    only the callbacks still owed: however many tickets the ledger holds, a
    pass with none owed looks at none."""
    import json

    from tickets.admission import admit_ticket

    make_endpoint("many")
    for i in range(150):  # a ledger of finished tickets, none owing a callback
        ticket = admit_ticket(endpoint="many", input={"i": i}).ticket
        runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="history")
    owner_cursor.execute("ANALYZE tickets_ticket")  # the application role may not
    plan = json.loads(callbacks.pending_callbacks().explain(format="json", analyze=True))
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    removed = sum(node.get("Rows Removed by Filter", 0) for node in nodes)
    assert removed == 0 and not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
    assert callbacks.retry_pending_callbacks() == 0
