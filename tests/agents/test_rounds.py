"""Several rounds of pending calls in one agent exchange, for both
frameworks (real PostgreSQL; each turn in its own process, as on a worker):
the exchange's ticket stays waiting from round to round, each round's
children and approvals are its own, the final round's turn completes it,
and the round cap fails it with a clear code."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import ContextEntry, EndpointLock, Ticket, TicketEvent, Turn

pytestmark = pytest.mark.django_db(transaction=True)

RUNNERS = {
    "pydantic_ai": {
        "kind": "agent",
        "framework": "pydantic_ai",
        "path": "tests.agents.rounds_agent.build",
    },
    "openai_agents": {
        "kind": "agent",
        "framework": "openai_agents",
        "path": "tests.agents.openai_agent.build",
        "side_effect_tools": ["send_report"],
    },
    "langgraph": {
        "kind": "agent",
        "framework": "langgraph",
        "path": "tests.agents.langgraph_agent.build",
        "side_effect_tools": ["send_report"],
    },
}


@pytest.fixture(params=sorted(RUNNERS))
def framework(request):
    return request.param


@pytest.fixture
def agent_ep(make_endpoint, framework):
    make_endpoint("demo.echo")
    make_endpoint("demo.fail", path="runtime.demo.fail")
    return make_endpoint("rounds.agent", runner=RUNNERS[framework])


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def ask(prompt: str) -> Ticket:
    return run(admit_ticket(endpoint="rounds.agent", input={"prompt": prompt}).ticket)


def open_children(parent: Ticket) -> list[Ticket]:
    """The parent's delegated children that have not run yet (its approval
    tickets are on the agent's own endpoint)."""
    return list(
        Ticket.objects.filter(parent=parent, state="queued")
        .exclude(endpoint=parent.endpoint)
        .order_by("id")
    )


def settle_round(parent: Ticket) -> list[Ticket]:
    """Run the open children, then their callbacks; the callbacks, in order."""
    children = open_children(parent)
    assert children, "no open children"
    for child in children:
        run(child)
    callbacks = list(Ticket.objects.filter(callback_for__in=children).order_by("id"))
    assert len(callbacks) == len(children)
    for cb in callbacks:
        run(cb)
    parent.refresh_from_db()
    return callbacks


def approve(api, ticket: Ticket, approve: bool = True, reason: str = "fine") -> Ticket:
    [call] = [
        c
        for c in api.get("/endpoints/rounds.agent/approvals").json()
        if c["ticket"] == str(ticket.id) and c["decision"] is None
    ]
    decided = api.post(
        f"/endpoints/rounds.agent/approvals/{ticket.id}/{call['call_id']}",
        {"approve": approve, "reason": reason},
    )
    assert decided.status_code == 200, decided.json()
    approval = run(Ticket.objects.get(id=decided.json()["approval_ticket"]))
    assert approval.state == "succeeded", approval.error
    ticket.refresh_from_db()
    return approval


def test_two_rounds_of_delegation_then_done(agent_ep):
    parent = ask("steps delegate alpha, beta | delegate gamma")
    assert parent.state == "waiting", parent.error
    first = settle_round(parent)
    # Round 2: the exchange's ticket still waits, on a child of its own; the
    # callback whose turn asked for it succeeded and waits on nothing.
    assert parent.state == "waiting", parent.error
    assert EndpointLock.objects.get(endpoint=agent_ep).holder_id is None
    resumed = Ticket.objects.get(id=first[0].id)
    assert resumed.state == "succeeded"
    assert resumed.result == {"resumed": str(parent.id), "outcome": "waiting", "round": 2}
    # The second callback of round 1 finds round 2 waiting and runs no agent.
    late = Ticket.objects.get(id=first[1].id)
    assert late.state == "succeeded" and late.result["round"] == 2
    assert late.result["waiting_for"]
    assert not TicketEvent.objects.filter(ticket=late, kind="agent_usage").exists()
    again = TicketEvent.objects.get(ticket=parent, kind="waiting_again")
    assert again.detail["continuation"]["agent"]["round"] == 2
    [gamma] = open_children(parent)
    assert gamma.input == {"text": "gamma"} and str(gamma.id) in again.detail["children"]
    assert gamma.continuation["agent"]["exchange"] == str(parent.id)
    assert gamma.return_to.address == "rounds.agent"
    # Another ticket on the agent runs while the exchange waits.
    assert ask("hello").state == "succeeded"

    [final] = settle_round(parent)
    assert parent.state == "succeeded", parent.error
    assert parent.completed_by_turn_id == Turn.objects.get(ticket=final).id
    assert parent.result.startswith("done: delegate: ")
    for word in ("alpha", "beta", "gamma"):
        assert word in parent.result
    # The exchange's messages, round by round, in the conversation.
    pointers = [
        a
        for e in ContextEntry.objects.filter(endpoint=agent_ep).order_by("seq")
        for a in e.artifacts
        if a.get("role") == "agent_messages" and a["exchange"] == str(parent.id)
    ]
    assert [p["status"] for p in pointers] == ["waiting", "waiting", "done"]


def test_delegation_then_approval_then_done(agent_ep, api):
    parent = ask("steps delegate alpha | send ops")
    settle_round(parent)
    assert parent.state == "waiting", parent.error
    # The approval of round 2 is on the exchange's ticket.
    [call] = api.get("/endpoints/rounds.agent/approvals").json()
    assert call["ticket"] == str(parent.id) and call["tool"] == "send_report"
    assert call["args"] == {"to": "ops"} and call["decision"] is None
    approval = approve(api, parent, reason="ops asked")
    assert parent.state == "succeeded", parent.error
    assert approval.dedupe_key.startswith(f"approval:{parent.id}:r2:")
    assert "alpha" in parent.result and "sent to ops with key cc-" in parent.result


def test_approval_then_delegation_then_a_denial(agent_ep, api):
    parent = ask("steps send ops | delegate alpha | send everyone")
    assert parent.state == "waiting", parent.error
    approve(api, parent)
    assert parent.state == "waiting", parent.error
    settle_round(parent)
    assert parent.state == "waiting", parent.error
    approve(api, parent, approve=False, reason="too wide")
    assert parent.state == "succeeded", parent.error
    assert "sent to ops" in parent.result and "alpha" in parent.result
    assert "too wide" in parent.result and "sent to everyone" not in parent.result
    decided = TicketEvent.objects.filter(ticket=parent, kind="tool_call_decided").order_by("id")
    assert [e.detail["round"] for e in decided] == [1, 3]


def test_the_round_cap_fails_the_exchange(agent_ep, framework):
    from endpoints.services import update_endpoint

    update_endpoint(
        address="rounds.agent",
        changes={"runner": {**RUNNERS[framework], "max_rounds": 2}},
        actor="test",
    )
    parent = ask("steps delegate a | delegate b | delegate c")
    settle_round(parent)
    assert parent.state == "waiting"
    [last] = settle_round(parent)
    assert parent.state == "failed"
    assert parent.error["code"] == "agent_max_rounds"
    assert "round 3" in parent.error["detail"] and "at most 2" in parent.error["detail"]
    assert Ticket.objects.get(id=last.id).result["outcome"] == "failed"
    assert not open_children(parent)


def test_a_round_whose_child_cannot_be_admitted_fails_the_exchange(agent_ep):
    parent = ask("steps delegate alpha | delegate-to no.such.endpoint beta")
    [callback] = settle_round(parent)
    assert parent.state == "failed"
    assert parent.error["code"] == "not_found"
    assert parent.error["detail"].startswith("cannot dispatch children: ")
    assert Ticket.objects.get(id=callback.id).state == "succeeded"
    assert not Ticket.objects.filter(parent=parent, endpoint__address="no.such.endpoint").exists()


def test_an_exchange_cut_by_the_history_window_is_not_resumed_or_recalled():
    """An exchange whose first turn is older than the entries a turn reads
    is not whole: left out of the conversation, and an error to resume."""
    from runtime.agents import memory

    def entry(seq: int, ticket: str, exchange: str, status: str) -> dict:
        pointer = memory.store(
            framework="pydantic_ai",
            exchange=exchange,
            status=status,
            messages=[{"seq": seq}],
            state=None,
        )
        return {"seq": seq, "ticket": ticket, "artifacts": [pointer]}

    history = [
        entry(1, "a", "a", "done"),
        # Exchange b's first turn (seq 2) fell out of the window.
        entry(3, "cb", "b", "done"),
        entry(4, "c", "c", "waiting"),
        entry(5, "cb2", "c", "waiting"),
    ]
    earlier, _, _ = memory.conversation(history, resuming=None, runner={})
    assert earlier == [[{"seq": 1}]]
    earlier, resumed, _ = memory.conversation(history, resuming="c", runner={})
    assert resumed == [{"seq": 4}, {"seq": 5}]
    with pytest.raises(memory.MemoryError_, match="AGENT_HISTORY_MAX_ENTRIES"):
        memory.conversation(
            history[1:2] + [entry(6, "cb3", "b2", "waiting")], resuming="b2", runner={}
        )
