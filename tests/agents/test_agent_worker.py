"""demo.agent on real worker processes (PostgreSQL, Redis, Celery; an
offline model): memory across tickets, delegation that ends the turn while
another ticket runs, a failed child, an approval, a budget interrupt that
cancels a slow tool call, and a SIGKILLed worker's tool receipt."""

from __future__ import annotations

import signal

import pytest

from recovery.models import RecoveryCase
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketEvent, Turn

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}
TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")


def state_of(ticket_id) -> str:
    return Ticket.objects.values_list("state", flat=True).get(id=ticket_id)


def ask(prompt: str, endpoint: str = "demo.agent") -> Ticket:
    return admit_ticket(endpoint=endpoint, input={"prompt": prompt}).ticket


def settled(ticket: Ticket, timeout: float = 30) -> Ticket:
    wait_for(
        lambda: state_of(ticket.id) in TERMINAL,
        timeout=timeout,
        message=f"ticket {ticket.input} to finish",
    )
    ticket.refresh_from_db()
    return ticket


@pytest.fixture
def demo(make_endpoint):
    make_endpoint("demo.echo")
    make_endpoint("demo.sleep", path="runtime.demo.sleep")
    make_endpoint("demo.fail", path="runtime.demo.fail")
    make_endpoint("demo.agent", runner=AGENT)


def test_demo_agent_on_a_worker(celery_procs, demo, make_endpoint, api):
    """One worker for every flow (its start-up is most of the cost): a budget
    interrupt, memory, delegation, a failed child, an approval."""
    # The framework warmed before the pool forks (AGENT_PRELOAD): a 1 s
    # budget is the tool's, not the import's.
    celery_procs.env["AGENT_PRELOAD"] = "pydantic_ai"
    celery_procs.worker_and_beat()

    # A budget interrupt cancels the agent awaiting a slow tool, within grace.
    make_endpoint("budget.agent", runner=AGENT, turn_budget_s=1, interrupt_grace_s=6)
    ticket = ask("slow 60", endpoint="budget.agent")
    ticket = settled(ticket, timeout=20)
    assert ticket.state == "failed" and ticket.error["code"] == "timed_out"
    turn = Turn.objects.get(ticket=ticket)
    assert turn.state == "stopped"
    assert turn.stop_evidence["kind"] == "runner_returned"
    assert turn.stop_evidence["detail"]["cancelled"] == "asyncio"
    # Cancelled at its await, within the grace: no SIGTERM was needed.
    assert turn.stop_evidence["detail"]["signals_sent"] == []
    assert turn.stop_evidence["detail"]["cancel_latency_s"] < 1
    # From the sweep's request: the beat that carries the flag (every 3 s
    # here: half the grace), the cancel, the finish -- within the 6 s grace.
    assert (turn.ended_at - turn.interrupt_requested_at).total_seconds() < 6
    receipts = [
        (e.kind, e.detail.get("status"))
        for e in TicketEvent.objects.filter(ticket=ticket, kind__startswith="tool_").order_by("id")
    ]
    assert receipts == [("tool_started", None), ("tool_ended", "cancelled")]

    # Memory: the second ticket sees the first's conversation.
    assert settled(ask("remember the code is 42")).state == "succeeded"
    assert settled(ask("recall")).result == "I remember: the code is 42"

    # Delegation ends the turn; another ticket runs while the children do.
    parent = ask("delegate-slow alpha, beta")
    wait_for(lambda: state_of(parent.id) == "waiting", message="the parent to wait")
    children = list(Ticket.objects.filter(parent=parent).order_by("id"))
    assert len(children) == 2
    meanwhile = settled(ask("remember tea"))
    assert meanwhile.state == "succeeded"
    assert [state_of(c.id) for c in children] != ["succeeded", "succeeded"]
    assert state_of(parent.id) == "waiting"
    parent = settled(parent)
    assert parent.state == "succeeded", parent.error
    assert parent.result.startswith("children said: ok {'slept_s'")
    resumed_by = Turn.objects.get(id=parent.completed_by_turn_id)
    assert resumed_by.ticket.callback_for_id in {c.id for c in children}

    # A failed child reaches the agent as an error, not a success.
    failing = settled(ask("delegate fail"))
    assert failing.state == "succeeded"
    assert failing.result.startswith("children said: failed (the delegated work did not succeed")

    # An approval-requiring tool waits for an owner and resumes after it.
    asking = ask("send ops")
    wait_for(lambda: state_of(asking.id) == "waiting", message="the approval wait")
    call = api.get("/endpoints/demo.agent/approvals").json()[0]
    decided = api.post(
        f"/endpoints/demo.agent/approvals/{asking.id}/{call['call_id']}",
        {"approve": True, "reason": "ops asked for it"},
    )
    assert decided.status_code == 200, decided.json()
    asking = settled(asking)
    assert asking.result.startswith("done: send_report: sent to ops with key cc-")


def test_rounds_of_pending_calls_on_a_worker(celery_procs, make_endpoint, api):
    """One exchange, three rounds on real workers: a delegation, another
    after it, an owner's approval; the exchange's ticket waits throughout
    and the last round's turn completes it. The same for the Agents SDK."""
    celery_procs.env["AGENT_PRELOAD"] = "pydantic_ai,openai_agents"
    celery_procs.worker_and_beat()
    make_endpoint("demo.echo")
    make_endpoint("rounds.agent", runner={**AGENT, "path": "tests.agents.rounds_agent.build"})
    make_endpoint(
        "sdk.agent",
        runner={
            "kind": "agent",
            "framework": "openai_agents",
            "path": "tests.agents.openai_agent.build",
            "side_effect_tools": ["send_report"],
        },
    )
    for address in ("rounds.agent", "sdk.agent"):
        parent = ask("steps delegate alpha | delegate beta, gamma | send ops", endpoint=address)

        def approval_pending(address=address, parent=parent):
            return [
                c
                for c in api.get(f"/endpoints/{address}/approvals").json()
                if c["ticket"] == str(parent.id)
            ]

        [call] = wait_for(
            approval_pending, timeout=60, interval=0.3, message=f"{address}'s third round"
        )
        assert state_of(parent.id) == "waiting"
        children = Ticket.objects.filter(parent=parent, callback_for__isnull=True)
        assert sorted(c.input["text"] for c in children if "text" in c.input) == [
            "alpha",
            "beta",
            "gamma",
        ]
        assert TicketEvent.objects.filter(ticket=parent, kind="waiting_again").count() == 2
        decided = api.post(
            f"/endpoints/{address}/approvals/{parent.id}/{call['call_id']}",
            {"approve": True, "reason": "ops asked for it"},
        )
        assert decided.status_code == 200, decided.json()
        parent = settled(parent)
        assert parent.state == "succeeded", parent.error
        assert parent.result.startswith("done: delegate: ")
        for word in ("alpha", "beta", "gamma", "sent to ops with key cc-"):
            assert word in parent.result, (address, parent.result)
        # The first turn of the endpoint that finds every answer resumes the
        # exchange: the approval ticket's, or a late callback's of round 2
        # that ran after the decision; the other finds it done. The approved
        # call ran once either way.
        approval = settled(Ticket.objects.get(id=decided.json()["approval_ticket"]))
        assert approval.state == "succeeded", approval.error
        sent = TicketEvent.objects.filter(
            kind="tool_started", detail__tool="send_report", ticket__trace_id=parent.trace_id
        )
        assert sent.count() == 1


def test_a_worker_killed_mid_tool_call_leaves_a_started_receipt(
    celery_procs, make_endpoint, client
):
    from django.contrib.auth import get_user_model

    from recovery.services import inspect_case

    celery_procs.env["AGENT_PRELOAD"] = "pydantic_ai"
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint("demo.agent", runner=AGENT, heartbeat_timeout_s=1.5, interrupt_grace_s=1)
    ticket = ask("slow 120")
    wait_for(
        lambda: TicketEvent.objects.filter(ticket=ticket, kind="tool_started").exists(),
        message="the tool call to start",
    )
    celery_procs.kill("turns", sig=signal.SIGKILL)
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=ticket).first(),
        timeout=20,
        message="quarantine after the heartbeat went stale",
    )
    assert case.endpoint.state == "quarantined"
    owner = get_user_model().objects.create_user("boss", is_staff=True)
    snapshot = inspect_case(case_id=case.id, user=owner).snapshot
    kinds = [e["kind"] for e in snapshot["events"]]
    assert "tool_started" in kinds and "tool_ended" not in kinds
    [call] = snapshot["tool_calls"]
    assert call["tool"] == "slow" and call["ended_at"] is None and call["status"] is None
    assert state_of(ticket.id) == "recovering"
    # The case page says what already happened.
    client.force_login(owner)
    page = client.get(f"/recovery/{case.id}/").content.decode()
    assert "Tool calls of the uncertain turn" in page and "no end recorded" in page
