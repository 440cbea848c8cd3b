"""The LangGraph adapter in-process (real PostgreSQL; each turn in its own
process), on a scripted offline chat model: history, delegation, a failed
child, an approval, a denial, receipts, the generation's notes -- the same
checks as the other two frameworks' (test_openai_agents.py)."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {
    "kind": "agent",
    "framework": "langgraph",
    "path": "tests.agents.langgraph_agent.build",
    "side_effect_tools": ["send_report"],
}


@pytest.fixture
def agent_ep(make_endpoint):
    make_endpoint("demo.echo")
    make_endpoint("demo.fail", path="runtime.demo.fail")
    return make_endpoint("graph.agent", runner=AGENT)


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def ask(prompt: str) -> Ticket:
    return run(admit_ticket(endpoint="graph.agent", input={"prompt": prompt}).ticket)


def settle_children(parent: Ticket) -> Ticket:
    children = list(Ticket.objects.filter(parent=parent, callback_for__isnull=True).order_by("id"))
    for child in children:
        run(child)
    for cb in Ticket.objects.filter(callback_for__in=children).order_by("id"):
        run(cb)
    parent.refresh_from_db()
    return parent


def test_history_delegation_and_a_failed_child(agent_ep):
    first = ask("remember the code is 42")
    assert first.state == "succeeded", first.error
    assert first.result == "noted: the code is 42"
    assert ask("recall").result == "I remember: the code is 42"

    parent = ask("delegate alpha, beta")
    assert parent.state == "waiting", parent.error
    assert EndpointLock.objects.get(endpoint=agent_ep).holder_id is None
    assert Ticket.objects.filter(parent=parent).count() == 2
    assert ask("remember tea").state == "succeeded"  # the lock was released
    parent = settle_children(parent)
    assert parent.state == "succeeded", parent.error
    assert parent.result == (
        'results: delegate: {"echo": {"text": "alpha"}}; delegate: {"echo": {"text": "beta"}}'
    )
    assert ask("recall").result == "I remember: the code is 42; tea"

    failing = settle_children(ask("delegate fail"))
    assert failing.state == "succeeded"
    assert failing.result.startswith("results: delegate: error: the delegated work did not succeed")


def test_an_approval_waits_and_resumes(agent_ep, api):
    ticket = ask("send ops")
    assert ticket.state == "waiting", ticket.error
    [call] = api.get("/endpoints/graph.agent/approvals").json()
    assert call["tool"] == "send_report" and call["args"] == {"to": "ops"}
    decided = api.post(
        f"/endpoints/graph.agent/approvals/{ticket.id}/{call['call_id']}",
        {"approve": True, "reason": "fine"},
    ).json()
    run(Ticket.objects.get(id=decided["approval_ticket"]))
    ticket.refresh_from_db()
    assert ticket.state == "succeeded", ticket.error
    assert ticket.result.startswith("results: send_report: sent to ops with key cc-")
    started = TicketEvent.objects.get(ticket_id=decided["approval_ticket"], kind="tool_started")
    assert started.detail["idempotency_key"] in ticket.result


def test_the_generations_notes_follow_the_agents_own_instructions(agent_ep):
    from endpoints.services import update_endpoint

    assert ask("instructions").result == "instructions: answer"
    update_endpoint(
        address="graph.agent", changes={"notes": "Check the search tool first."}, reason="lesson"
    )
    said = ask("instructions").result
    assert said.startswith("instructions: answer\n\n")
    assert said.endswith("Check the search tool first.")


def test_a_denied_interrupt_tells_the_graph_why(agent_ep, api):
    ticket = ask("send everyone")
    [call] = api.get("/endpoints/graph.agent/approvals").json()
    decided = api.post(
        f"/endpoints/graph.agent/approvals/{ticket.id}/{call['call_id']}",
        {"approve": False, "reason": "too wide"},
    ).json()
    run(Ticket.objects.get(id=decided["approval_ticket"]))
    ticket.refresh_from_db()
    assert ticket.state == "succeeded", ticket.error
    assert ticket.result == "results: send_report: an owner denied this call: too wide"
    assert not TicketEvent.objects.filter(kind="tool_started", detail__tool="send_report").exists()


def test_usage_is_recorded_per_turn(agent_ep):
    ticket = ask("remember usage")
    usage = TicketEvent.objects.get(ticket=ticket, kind="agent_usage").detail
    assert usage["requests"] == 1 and usage["input_tokens"] > 0 and usage["output_tokens"] == 1


@pytest.mark.integration
def test_the_graph_on_a_worker(celery_procs, make_endpoint, api):
    """Real worker processes (PostgreSQL, Redis, Celery): a budget interrupt
    cancels the graph awaiting a slow tool, memory across tickets,
    delegation that ends the turn while another ticket runs, and one
    exchange of three rounds (two delegations, an owner's approval)."""
    from tests.agents.test_agent_worker import TERMINAL, state_of
    from tests.conftest import wait_for
    from tickets.models import Turn

    def settled(ticket: Ticket, timeout: float = 60) -> Ticket:
        wait_for(lambda: state_of(ticket.id) in TERMINAL, timeout=timeout, message="a ticket")
        ticket.refresh_from_db()
        return ticket

    def submit(prompt: str, endpoint: str = "graph.agent") -> Ticket:
        return admit_ticket(endpoint=endpoint, input={"prompt": prompt}).ticket

    celery_procs.env["AGENT_PRELOAD"] = "langgraph"
    celery_procs.worker_and_beat()
    make_endpoint("demo.echo")
    make_endpoint("graph.agent", runner=AGENT)
    make_endpoint("budget.graph", runner=AGENT, turn_budget_s=3, interrupt_grace_s=6)

    slow = settled(submit("slow 60", endpoint="budget.graph"), timeout=30)
    assert slow.state == "failed" and slow.error["code"] == "timed_out"
    turn = Turn.objects.get(ticket=slow)
    assert turn.stop_evidence["kind"] == "runner_returned"
    assert turn.stop_evidence["detail"]["cancelled"] == "asyncio"
    assert turn.stop_evidence["detail"]["signals_sent"] == []
    receipts = [
        (e.kind, e.detail.get("status"))
        for e in TicketEvent.objects.filter(ticket=slow, kind__startswith="tool_").order_by("id")
    ]
    assert receipts == [("tool_started", None), ("tool_ended", "cancelled")]

    assert settled(submit("remember the code is 42")).state == "succeeded"
    assert settled(submit("recall")).result == "I remember: the code is 42"

    parent = submit("steps delegate alpha | delegate beta, gamma | send ops")

    def approval_pending():
        return [
            c
            for c in api.get("/endpoints/graph.agent/approvals").json()
            if c["ticket"] == str(parent.id)
        ]

    [call] = wait_for(approval_pending, timeout=90, interval=0.3, message="the third round")
    assert state_of(parent.id) == "waiting"
    children = Ticket.objects.filter(parent=parent, callback_for__isnull=True)
    assert sorted(c.input["text"] for c in children if "text" in c.input) == [
        "alpha",
        "beta",
        "gamma",
    ]
    assert TicketEvent.objects.filter(ticket=parent, kind="waiting_again").count() == 2
    # Another ticket runs while the exchange waits.
    assert settled(submit("remember tea")).state == "succeeded"
    decided = api.post(
        f"/endpoints/graph.agent/approvals/{parent.id}/{call['call_id']}",
        {"approve": True, "reason": "ops asked for it"},
    )
    assert decided.status_code == 200, decided.json()
    parent = settled(parent)
    assert parent.state == "succeeded", parent.error
    assert parent.result.startswith("done: delegate: ")
    for word in ("alpha", "beta", "gamma", "sent to ops with key cc-"):
        assert word in parent.result, parent.result
    sent = TicketEvent.objects.filter(
        kind="tool_started", detail__tool="send_report", ticket__trace_id=parent.trace_id
    )
    assert sent.count() == 1
    assert settled(submit("recall")).result == "I remember: the code is 42; tea"


def test_the_example_research_graph_runs_offline(make_endpoint, settings):
    """examples/research_langgraph.py, as docs/howto/langgraph.md runs it: the
    researcher waits on both sub-agents, their callbacks resume it."""
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = [
        *settings.RUNNER_PYTHON_ALLOWED_PREFIXES,
        "examples.",
    ]
    for role, factory in (
        ("research", "researcher"),
        ("search", "searcher"),
        ("summarize", "summarizer"),
    ):
        make_endpoint(
            f"examples.lg-{role}",
            runner={
                "kind": "agent",
                "framework": "langgraph",
                "path": f"examples.research_langgraph.{factory}",
            },
        )
    parent = run(
        admit_ticket(
            endpoint="examples.lg-research", input={"prompt": "durable agent runtimes"}
        ).ticket
    )
    assert parent.state == "waiting", parent.error
    parent = settle_children(parent)
    assert parent.state == "succeeded", parent.error
    assert parent.result == (
        "Brief: 3 sources on 'durable agent runtimes'; durable agent runtimes in one line"
    )
