"""Trace budgets (docs/howto/trace-budgets.md): a root's budget is stored on its trace;
every agent turn's usage counts against it; past the hard limit the trace
refuses admissions (429 ``trace_budget_exhausted``) and its running turns
are interrupted through the budget path. Real PostgreSQL, the demo agent
(Pydantic AI on an offline FunctionModel that reports usage), each turn in
its own process as on a worker."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.db import connections, transaction

from runtime import turns as runtime
from tests.waiting import wait_for
from tickets import budgets
from tickets.admission import admit_ticket
from tickets.models import LedgerEvent, Ticket, TicketEvent, Trace, Turn

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def spent(ticket: Ticket) -> int:
    """The tokens one ticket's turns reported (its ``agent_usage`` events)."""
    return sum(
        d.get("input_tokens", 0) + d.get("output_tokens", 0)
        for d in TicketEvent.objects.filter(ticket=ticket, kind="agent_usage").values_list(
            "detail", flat=True
        )
    )


def test_a_root_sets_the_budget_and_a_child_may_not(api, make_endpoint):
    make_endpoint("b.echo")
    resp = api.post(
        "/tickets", {"endpoint": "b.echo", "input": {}, "budget": {"tokens": 100, "wall_s": 60}}
    )
    assert resp.status_code == 201, resp.content
    root = resp.json()
    trace = Trace.objects.get(id=root["trace_id"])
    assert trace.budget == {"tokens": 100, "wall_s": 60}
    assert TicketEvent.objects.filter(ticket_id=root["id"], kind="trace_budget_set").exists()
    # The same root again (a client's long poll): the ticket, not a refusal.
    again = api.post(
        "/tickets",
        {"endpoint": "b.echo", "input": {}, "dedupe_key": "k", "budget": {"tokens": 7}},
    )
    assert again.status_code == 201
    dup = api.post(
        "/tickets",
        {"endpoint": "b.echo", "input": {}, "dedupe_key": "k", "budget": {"tokens": 7}},
    )
    assert dup.status_code == 200 and dup.json()["duplicate"] is True, dup.content
    child = api.post(
        "/tickets",
        {"endpoint": "b.echo", "input": {}, "parent": root["id"], "budget": {"tokens": 5}},
    )
    assert child.status_code == 400 and child.json()["error"] == "invalid", child.content
    for bad in ({}, {"tokens": 0}, {"tokens": 1.5}, {"cost": -1}, {"tokens": 5, "spoons": 1}):
        resp = api.post("/tickets", {"endpoint": "b.echo", "input": {}, "budget": bad})
        assert resp.status_code in (400, 422) and resp.json()["error"] == "invalid", bad
    # A root that joins a trace others already spend in may not set its budget.
    joined = api.post(
        "/tickets",
        {
            "endpoint": "b.echo",
            "input": {"n": 2},
            "trace_id": root["trace_id"],
            "budget": {"cost": 1},
        },
    )
    assert joined.status_code == 400, joined.content
    assert Trace.objects.get(id=root["trace_id"]).tickets == 1  # nothing admitted


def test_concurrent_charges_lose_nothing_and_cross_once(make_endpoint, settings):
    settings.MODEL_PRICES = {"m": {"input": 1000, "output": 2000}}
    make_endpoint("b.echo")
    root = admit_ticket(endpoint="b.echo", input={}).ticket
    budgets.open_budget(trace_id=root.trace_id, ticket_id=root.id, budget={"tokens": 1000})
    usage = {"model": "m", "input_tokens": 10, "output_tokens": 5}
    results = []

    def charge():
        try:
            for _ in range(5):
                results.append(
                    budgets.charge(
                        trace_id=root.trace_id, ticket_id=root.id, turn_id=None, usage=usage
                    )
                )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=charge) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trace = Trace.objects.get(id=root.trace_id)
    assert trace.spent_tokens == 80 * 15
    assert trace.spent_cost == Decimal("0.020000") * 80
    assert trace.exhausted_at is not None and trace.exhausted_reason == "tokens"
    assert sum(1 for r in results if r.exhausted) == 1
    assert sum(1 for r in results if r.warned) == 1
    kinds = list(LedgerEvent.objects.filter(ticket=root).values_list("kind", flat=True))
    assert kinds.count("trace_budget_warning") == 1
    assert kinds.count("trace_budget_exhausted") == 1


def test_two_agents_spend_past_the_budget_the_trace_closes_and_the_running_turn_stops(
    api, make_endpoint, client, staff_user, settings
):
    make_endpoint("b.agent-a", runner=AGENT, heartbeat_timeout_s=3, interrupt_grace_s=5)
    make_endpoint("b.agent-b", runner=AGENT, heartbeat_timeout_s=3, interrupt_grace_s=5)
    # Calibrate: what one "remember" costs on a fresh endpoint (the
    # offline model's usage is deterministic).
    make_endpoint("b.calibrate", runner=AGENT)
    probe = run(admit_ticket(endpoint="b.calibrate", input={"prompt": "remember alpha"}).ticket)
    one = spent(probe)
    assert one > 0, "the demo agent reports usage"
    usage = TicketEvent.objects.get(ticket=probe, kind="agent_usage").detail
    assert usage["model"], "and names its model"
    settings.MODEL_PRICES = {usage["model"]: {"input": 2, "output": 2}}  # per million
    # Room for the first two turns (one on each agent), not for a third.
    budget = 2 * one + one // 2

    resp = api.post(
        "/tickets",
        {
            "endpoint": "b.agent-a",
            "input": {"prompt": "remember alpha"},
            "budget": {"tokens": budget},
        },
    )
    assert resp.status_code == 201, resp.content
    root = Ticket.objects.get(id=resp.json()["id"])
    trace_id = root.trace_id
    assert run(root).state == "succeeded"
    first = admit_ticket(
        endpoint="b.agent-b", input={"prompt": "remember beta"}, trace_id=trace_id
    ).ticket
    assert run(first).state == "succeeded"
    trace = Trace.objects.get(id=trace_id)
    assert trace.spent_tokens == spent(root) + spent(first) < budget
    assert trace.exhausted_at is None

    # Agent A works on a slow tool while agent B spends past the budget.
    slow = admit_ticket(endpoint="b.agent-a", input={"prompt": "slow 120"}, trace_id=trace_id)
    slow = slow.ticket
    worker = threading.Thread(target=lambda: (run(slow), connections.close_all()))
    started = time.monotonic()
    worker.start()
    wait_for(
        lambda: Turn.objects.filter(ticket=slow, state="running").exists(),
        timeout=60,
        message="the slow turn",
    )
    third = admit_ticket(
        endpoint="b.agent-b", input={"prompt": "remember gamma"}, trace_id=trace_id
    ).ticket
    run(third)

    trace.refresh_from_db()
    assert trace.spent_tokens >= budget and trace.exhausted_reason == "tokens"
    assert trace.spent_cost == Decimal(2 * trace.spent_tokens) / 1_000_000
    assert trace.exhausted_at is not None
    crossed = TicketEvent.objects.get(kind="trace_budget_exhausted")
    assert crossed.ticket_id == third.id and crossed.detail["limit"] == "tokens"
    warned = TicketEvent.objects.filter(kind="trace_budget_warning")
    assert warned.count() == 1
    # The turn that crossed was running too: asked to stop like the others;
    # its outcome stands only if it returned before the ask (a late outcome).
    third.refresh_from_db()
    assert third.state == "succeeded" or third.error["code"] == "trace_budget_exhausted"

    # The breaker is open: no admission in the trace, by the API or a service.
    refused = api.post(
        "/tickets", {"endpoint": "b.agent-a", "input": {"prompt": "hi"}, "trace_id": trace_id}
    )
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"] == "trace_budget_exhausted"
    assert refused.json()["trace_id"] == trace_id
    child = api.post(
        "/tickets", {"endpoint": "b.agent-b", "input": {"prompt": "hi"}, "parent": str(root.id)}
    )
    assert child.status_code == 429 and child.json()["error"] == "trace_budget_exhausted"
    assert Ticket.objects.filter(trace_id=trace_id).count() == 4

    # The running turn was interrupted through the budget path, and stopped.
    worker.join(timeout=90)
    assert not worker.is_alive()
    assert time.monotonic() - started < 60, "stopped by the interrupt, not the tool's end"
    slow.refresh_from_db()
    assert slow.state == "failed" and slow.error["code"] == "trace_budget_exhausted", slow.error
    turn = Turn.objects.get(ticket=slow)
    assert turn.interrupt_reason == "trace_budget_exhausted" and turn.state == "stopped"
    asked = TicketEvent.objects.get(ticket=slow, kind="interrupt_requested")
    assert asked.actor == "budget" and asked.detail["reason"] == "trace_budget_exhausted"
    stopped = TicketEvent.objects.get(ticket=slow, kind="turn_stopped")
    assert stopped.detail  # the stop evidence (the runner's return, its cancel)

    # The trace page shows what was spent against the budget.
    client.force_login(staff_user)
    page = client.get(f"/traces/{trace_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="budget"' in html and "trace_budget_exhausted" in html
    assert f'<td class="num">{trace.spent_tokens}</td><td class="num">{budget}</td>' in html


def test_an_unbudgeted_trace_writes_nothing_per_turn(make_endpoint):
    make_endpoint("b.agent", runner=AGENT)
    ticket = run(admit_ticket(endpoint="b.agent", input={"prompt": "remember x"}).ticket)
    assert spent(ticket) > 0
    # A root that opened its trace alone: not even a trace row.
    assert not Trace.objects.filter(id=ticket.trace_id).exists()


def test_past_its_wall_clock_the_trace_closes_and_its_running_turn_stops(api, make_endpoint):
    make_endpoint("b.sleep", path="runtime.demo.sleep", heartbeat_timeout_s=3, interrupt_grace_s=5)
    resp = api.post(
        "/tickets",
        {"endpoint": "b.sleep", "input": {"seconds": 120}, "budget": {"wall_s": 1}},
    )
    assert resp.status_code == 201, resp.content
    root = Ticket.objects.get(id=resp.json()["id"])
    worker = threading.Thread(target=lambda: (run(root), connections.close_all()))
    started = time.monotonic()
    worker.start()
    wait_for(
        lambda: Turn.objects.filter(ticket=root, state="running").exists(),
        timeout=60,
        message="the turn",
    )
    asked: list = []
    # The sweep closes the trace once its clock ran out (1 s after the root).
    wait_for(
        lambda: asked.extend(runtime.sweep_trace_budgets()) or asked,
        timeout=30,
        message="the wall-clock sweep",
    )
    assert asked == [Turn.objects.get(ticket=root).id]
    assert runtime.sweep_trace_budgets() == []  # once
    trace = Trace.objects.get(id=root.trace_id)
    assert trace.exhausted_reason == "wall_s" and trace.exhausted_at is not None
    event = TicketEvent.objects.get(kind="trace_budget_exhausted")
    assert event.ticket_id == root.id and event.detail["limit"] == "wall_s"
    refused = api.post("/tickets", {"endpoint": "b.sleep", "input": {}, "trace_id": root.trace_id})
    assert refused.status_code == 429 and refused.json()["error"] == "trace_budget_exhausted"
    worker.join(timeout=60)
    assert not worker.is_alive() and time.monotonic() - started < 60
    root.refresh_from_db()
    assert root.state == "failed" and root.error["code"] == "trace_budget_exhausted"


def test_the_trace_budget_sweep_reads_only_active_turns_and_open_budgets():
    from tests.endpoints.test_sweep_plans import plan

    running = Turn.objects.filter(state="running").values_list("id", "seq", "ticket__trace_id")
    with transaction.atomic():  # SET LOCAL holds in a transaction only
        assert "turn_active_deadline_idx" in plan(running)
    with transaction.atomic(), connections["default"].cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + budgets._EXPIRE_SQL)
        text = "\n".join(row[0] for row in cur.fetchall())
    assert "trace_budget_open" in text, text
