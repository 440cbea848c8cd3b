"""The Pydantic AI runner in-process (real PostgreSQL; each turn forks its
own process as on a worker): memory, delegation, a failed child, approvals,
receipts, the cap, compact rows."""

from __future__ import annotations

import pytest
from django.db import connection

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import ContextEntry, EndpointLock, Ticket, TicketEvent, Turn

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


@pytest.fixture
def agent_ep(make_endpoint):
    make_endpoint("demo.echo")
    make_endpoint("demo.fail", path="runtime.demo.fail")
    return make_endpoint("demo.agent", runner=AGENT)


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def ask(prompt: str) -> Ticket:
    return run(admit_ticket(endpoint="demo.agent", input={"prompt": prompt}).ticket)


def run_children_and_callbacks(parent: Ticket) -> list[Ticket]:
    children = list(Ticket.objects.filter(parent=parent, callback_for__isnull=True).order_by("id"))
    for child in children:
        run(child)
    callbacks = list(Ticket.objects.filter(callback_for__in=children).order_by("id"))
    for cb in callbacks:
        run(cb)
    return callbacks


def test_the_second_ticket_sees_the_first_ones_conversation(agent_ep):
    first = ask("remember the code is 42")
    assert first.state == "succeeded", first.error
    assert first.result == "noted: the code is 42 (0 earlier prompts)"
    second = ask("recall")
    assert second.state == "succeeded", second.error
    assert second.result == "I remember: the code is 42"
    # The messages live in artifacts; entries and tickets keep pointers only.
    entries = list(ContextEntry.objects.filter(endpoint=agent_ep).order_by("seq"))
    pointers = [a for e in entries for a in e.artifacts if a["role"] == "agent_messages"]
    assert [p["status"] for p in pointers] == ["done", "done"]
    assert all(p["uri"].startswith("artifact://agents/") for p in pointers)
    assert second.artifacts == [pointers[1]]


def test_delegation_waits_releases_the_lock_and_the_callback_turn_completes_it(agent_ep):
    parent = ask("delegate alpha, beta")
    assert parent.state == "waiting", parent.error
    assert EndpointLock.objects.get(endpoint=agent_ep).holder_id is None
    children = list(Ticket.objects.filter(parent=parent).order_by("id"))
    assert [c.endpoint.address for c in children] == ["demo.echo", "demo.echo"]
    assert [c.input for c in children] == [{"text": "alpha"}, {"text": "beta"}]
    # The lock is free: another ticket of the same agent runs meanwhile.
    other = ask("remember tea")
    assert other.state == "succeeded", other.error
    callbacks = run_children_and_callbacks(parent)
    parent.refresh_from_db()
    assert parent.state == "succeeded", parent.error
    assert parent.result == (
        "children said: ok {'echo': {'text': 'alpha'}}; ok {'echo': {'text': 'beta'}}"
    )
    # Completed by the exact turn of the first callback; the second found
    # it done and ran no agent.
    assert parent.completed_by_turn_id == Turn.objects.get(ticket=callbacks[0]).id
    assert Ticket.objects.get(id=callbacks[1].id).result["resumed"] is None
    # The conversation stays valid after the interleaving: the waiting
    # exchange joins the history when it completes.
    assert ask("recall").result == "I remember: tea"


def test_a_failed_child_reaches_the_agent_as_an_error(agent_ep):
    parent = ask("delegate fail")
    assert parent.state == "waiting"
    run_children_and_callbacks(parent)
    parent.refresh_from_db()
    assert parent.state == "succeeded"
    assert parent.result.startswith("children said: failed (the delegated work did not succeed")
    assert '"state":"failed"' in parent.result and "RuntimeError" in parent.result


def test_tool_calls_leave_receipts_when_they_start_and_end(agent_ep):
    ticket = ask("slow 0.1")
    assert ticket.state == "succeeded", ticket.error
    events = list(
        TicketEvent.objects.filter(ticket=ticket, kind__in=["tool_started", "tool_ended"])
        .order_by("id")
        .values("kind", "detail", "turn_id")
    )
    assert [e["kind"] for e in events] == ["tool_started", "tool_ended"]
    started, ended = (e["detail"] for e in events)
    assert started["tool"] == ended["tool"] == "slow"
    assert started["call_id"] == ended["call_id"]
    assert started["args"] == {"seconds": 0.1} and len(started["args_sha256"]) == 64
    assert ended["status"] == "ok" and ended["duration_ms"] >= 100
    assert ended["result"] == {"slept_s": 0.1}
    assert events[0]["turn_id"] == ticket.turn_id
    usage = TicketEvent.objects.get(ticket=ticket, kind="agent_usage").detail
    assert usage["requests"] == 2 and usage["tool_calls"] == 1


def test_an_approval_waits_for_an_owner_and_resumes_after_it(agent_ep, api):
    ticket = ask("send ops")
    assert ticket.state == "waiting", ticket.error
    assert not Ticket.objects.filter(parent=ticket).exists()
    pending = api.get("/endpoints/demo.agent/approvals").json()
    assert len(pending) == 1
    call = pending[0]
    assert call["tool"] == "send_report" and call["args"] == {"to": "ops"}
    assert call["ticket"] == str(ticket.id) and call["decision"] is None
    path = f"/endpoints/demo.agent/approvals/{ticket.id}/{call['call_id']}"
    assert api.post(path, {"approve": True, "reason": ""}).status_code == 422
    decided = api.post(path, {"approve": True, "reason": "ops asked for it"})
    assert decided.status_code == 200, decided.json()
    body = decided.json()
    # A repeat converges; a contrary decision is refused.
    assert api.post(path, {"approve": True, "reason": "ops asked for it"}).json()["duplicate"]
    assert api.post(path, {"approve": False, "reason": "no"}).status_code == 409
    run(Ticket.objects.get(id=body["approval_ticket"]))
    ticket.refresh_from_db()
    assert ticket.state == "succeeded", ticket.error
    assert ticket.result.startswith("done: send_report: sent to ops with key cc-")
    event = TicketEvent.objects.get(ticket=ticket, kind="tool_call_decided")
    assert event.actor == "user:staff" and event.detail["reason"] == "ops asked for it"
    started = TicketEvent.objects.get(ticket_id=body["approval_ticket"], kind="tool_started")
    assert started.detail["side_effect"] is True
    assert started.detail["idempotency_key"] in ticket.result


def test_a_denied_call_tells_the_agent_why(agent_ep, api):
    ticket = ask("send everyone")
    call = api.get("/endpoints/demo.agent/approvals").json()[0]
    path = f"/endpoints/demo.agent/approvals/{ticket.id}/{call['call_id']}"
    approval = api.post(path, {"approve": False, "reason": "too wide"}).json()["approval_ticket"]
    run(Ticket.objects.get(id=approval))
    ticket.refresh_from_db()
    assert ticket.state == "succeeded", ticket.error
    assert "too wide" in ticket.result and "sent to" not in ticket.result
    assert not TicketEvent.objects.filter(kind="tool_started", detail__tool="send_report").exists()


def test_only_owners_read_the_conversation(agent_ep, api, django_user_model):
    from accounts.keys import create_api_key

    ask("remember the code is 42")
    body = api.get("/endpoints/demo.agent/conversation").json()
    assert [t["status"] for t in body["turns"]] == ["done"]
    kinds = [m["kind"] for m in body["turns"][0]["messages"]]
    assert kinds == ["request", "response"]
    django_user_model.objects.create_user("stranger")
    _, key = create_api_key(username="stranger")
    stranger = api.as_key(key)
    assert stranger.get("/endpoints/demo.agent/conversation").status_code == 403
    assert stranger.get("/endpoints/demo.agent/approvals").status_code == 403


def test_history_lives_in_artifacts_and_rows_stay_compact(agent_ep):
    """50 turns of 10 KB messages: no ticket row grows with the history,
    and the cap keeps the newest whole exchanges."""
    from endpoints.services import update_endpoint

    update_endpoint(
        address="demo.agent",
        changes={"runner": {**AGENT, "history_max_messages": 20}},
        actor="test",
    )
    filler = "x" * 10_000
    for i in range(50):
        assert ask(f"remember {i} {filler}").state == "succeeded"
    recall = ask("recall")
    remembered = [
        item.split(" ")[0] for item in recall.result.removeprefix("I remember: ").split("; ")
    ]
    # 20 messages = the newest 10 exchanges (a request and a response each).
    assert remembered == [str(i) for i in range(40, 50)]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT max(pg_column_size(t.*)), max(pg_column_size(t.result)) "
            "FROM tickets_ticket t JOIN endpoints_endpoint e ON e.id = t.endpoint_id "
            "WHERE e.address = 'demo.agent'"
        )
        row_max, result_max = cur.fetchone()
    from django.conf import settings

    assert result_max <= settings.TICKET_MAX_RESULT_BYTES
    # The input and the answer (10 KB each, compressed by TOAST) and pointers.
    assert row_max < 25_000


def test_the_console_shows_owners_the_conversation_and_takes_a_decision(
    agent_ep, client, django_user_model
):
    ask("remember the code is 42")
    waiting = ask("send ops")
    owner = django_user_model.objects.create_user("boss", is_staff=True)
    client.force_login(owner)
    page = client.get("/endpoints/demo.agent/").content.decode()
    assert "Agent conversation" in page and "remember the code is 42" in page
    assert "noted: the code is 42" in page and "send_report" in page
    call_id = (
        Ticket.objects.get(id=waiting.id)
        .events.get(kind="waiting_for_children")
        .detail["continuation"]["agent"]["pending"]
    )
    [call_id] = list(call_id)
    answer = client.post(
        f"/endpoints/demo.agent/approvals/{waiting.id}/{call_id}/",
        {"decision": "deny", "reason": "not today"},
    )
    assert answer.status_code == 302
    event = TicketEvent.objects.get(ticket=waiting, kind="tool_call_decided")
    assert event.detail["approved"] is False and event.actor == "user:boss"
    # Someone who is not an owner sees neither, and cannot decide.
    stranger = django_user_model.objects.create_user("stranger")
    client.force_login(stranger)
    assert "Agent conversation" not in client.get("/endpoints/demo.agent/").content.decode()
    refused = client.post(
        f"/endpoints/demo.agent/approvals/{waiting.id}/{call_id}/",
        {"decision": "approve", "reason": "sneaky"},
    )
    assert refused.status_code == 404


def test_a_fenced_turns_messages_never_enter_the_conversation(agent_ep):
    """Only the exact turn's finish writes the pointer to its messages: a
    stale outcome (wrong seq) carrying a pointer is evidence, not memory."""
    from runtime.agents import memory
    from runtime.runners import Outcome

    ticket = admit_ticket(endpoint="demo.agent", input={"prompt": "remember real"}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    forged = memory.store(
        framework="pydantic_ai",
        exchange=str(ticket.id),
        status="done",
        messages=[
            {
                "kind": "request",
                "parts": [{"part_kind": "user-prompt", "content": "remember forged"}],
            }
        ],
        state=None,
    )
    late = runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq + 1,
        outcome=Outcome.success("noted: forged", artifacts=[forged]),
        source="test",
    )
    assert not late.accepted
    assert not ContextEntry.objects.filter(endpoint=agent_ep).exists()
    assert TicketEvent.objects.filter(ticket=ticket, kind="stale_outcome").exists()
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.failure({"code": "test", "detail": "the exact turn failed"}),
        source="test",
    )
    assert ask("recall").result == "I remember: "


def test_the_generations_notes_reach_the_agents_instructions(make_endpoint):
    from endpoints.services import update_endpoint

    runner = {"kind": "agent", "framework": "pydantic_ai", "path": "tests.agents.notes_agent.agent"}
    make_endpoint("notes.agent", runner=runner)
    first = run(admit_ticket(endpoint="notes.agent", input={"prompt": "go"}).ticket)
    assert first.result == "You are the notes agent.", first.error
    update_endpoint(
        address="notes.agent", changes={"notes": "Check the search tool first."}, reason="lesson"
    )
    second = run(admit_ticket(endpoint="notes.agent", input={"prompt": "go"}).ticket)
    assert second.result.startswith("You are the notes agent.")
    assert "Check the search tool first." in second.result, second.result
