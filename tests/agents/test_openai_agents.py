"""The OpenAI Agents SDK adapter in-process (real PostgreSQL; each turn in
its own process), on a local fake Model: history, delegation, a failed
child, an approval."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {
    "kind": "agent",
    "framework": "openai_agents",
    "path": "tests.agents.openai_agent.build",
    "side_effect_tools": ["send_report"],
}


@pytest.fixture
def agent_ep(make_endpoint):
    make_endpoint("demo.echo")
    make_endpoint("demo.fail", path="runtime.demo.fail")
    return make_endpoint("sdk.agent", runner=AGENT)


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def ask(prompt: str) -> Ticket:
    return run(admit_ticket(endpoint="sdk.agent", input={"prompt": prompt}).ticket)


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
    [call] = api.get("/endpoints/sdk.agent/approvals").json()
    assert call["tool"] == "send_report" and call["args"] == {"to": "ops"}
    decided = api.post(
        f"/endpoints/sdk.agent/approvals/{ticket.id}/{call['call_id']}",
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
        address="sdk.agent", changes={"notes": "Check the search tool first."}, reason="lesson"
    )
    said = ask("instructions").result
    assert said.startswith("instructions: answer\n\n")
    assert said.endswith("Check the search tool first.")
