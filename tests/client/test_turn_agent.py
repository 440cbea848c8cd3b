"""TurnAgent: the agent side of the turn API for an ``http`` runner, against
the real app and a real worker that POSTs the turn envelope to a local agent."""

from __future__ import annotations

import json

import pytest

from claimcheck_client import Client, StaleTurn, TurnAgent

from .helpers import poll

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def remote(loopback_allowed, worker, endpoint, recorder):
    """An endpoint whose http runner is a local agent that accepts every
    turn (202) and answers later; returns (address, agent)."""
    agent = recorder(202)
    address = endpoint(
        "remote",
        runner={"kind": "http", "url": f"{agent.url}/turn", "cancel_url": f"{agent.url}/cancel"},
    )
    return address, agent


def envelope_of(agent) -> dict:
    poll(lambda: agent.bodies("/turn"), message="the agent to receive the turn")
    return json.loads(agent.bodies("/turn")[-1])


def test_an_agent_heartbeats_and_answers_its_exact_turn(server, api_key, remote):
    address, agent = remote
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"ask": "later"})
        env = envelope_of(agent)
        # The envelope's turn token is the credential once the server issues
        # one; until then the explicit token= stands in.
        with TurnAgent(server, env, token=api_key) as turn:
            assert (turn.ticket_id, turn.input) == (ticket.id, {"ask": "later"})
            beat = turn.heartbeat()
            assert (beat.state, beat.seq, turn.interrupt_requested) == ("running", turn.seq, False)

            forged = {**env, "turn": {**env["turn"], "seq": env["turn"]["seq"] + 7}}
            with (
                TurnAgent(server, forged, token=api_key) as impostor,
                pytest.raises(StaleTurn) as info,
            ):
                impostor.result({"forged": True})
            assert info.value.status == 409 and info.value.ambiguous is False

            done = turn.result({"answer": 42})
            assert (done.state, done.seq) == ("completed", turn.seq)
            with pytest.raises(StaleTurn):
                turn.result({"answer": 43})  # late: refused, nothing changes
        shown = cc.get(ticket.id)
    assert (shown.state, shown.result) == ("succeeded", {"answer": 42})
    assert shown.turn is not None and shown.turn.state == "completed"


def test_an_interrupted_agent_sends_its_stop_receipt(server, api_key, remote):
    address, agent = remote
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"ask": "stop me"})
        turn = TurnAgent(server, envelope_of(agent), token=api_key)
        cc.cancel(ticket.id)  # running: an interrupt request, sent to the agent's cancel_url
        poll(lambda: agent.bodies("/cancel"), message="the cancel to reach the agent")
        assert json.loads(agent.bodies("/cancel")[0]) == {"turn": turn.turn_id, "seq": turn.seq}
        turn.heartbeat()
        assert turn.interrupt_requested is True
        stopped = turn.stopped("stopped on request")
        assert stopped.state == "stopped"
        assert cc.wait(ticket.id, timeout=20).state == "cancelled"
        turn.close()


def test_a_result_whose_answer_was_lost_is_resolved_by_its_repeat(
    server, api_key, remote, proxy, ledger
):
    address, agent = remote
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"ask": 1})
        env = envelope_of(agent)
        # The result is accepted but its answer dropped; the repeat of the
        # same result is recognised as the turn's own recorded outcome (its
        # digest on the terminal event) and answered as accepted.
        p = proxy(["drop", "forward"])
        with TurnAgent(p.url, env, token=api_key) as turn:
            done = turn.result({"answer": 1})
        assert (done.state, done.seq) == ("completed", turn.seq)
        assert [(s.action, s.method) for s in p.seen] == [("drop", "POST"), ("forward", "POST")]
        assert cc.get(ticket.id).result == {"answer": 1}
    events = ledger.events(ticket.id)
    # One completion, and the repeat wrote nothing: not even stale evidence.
    assert (events.count("turn_completed"), events.count("stale_outcome")) == (1, 0)


def test_the_envelope_token_is_the_credential(recorder):
    server = recorder(200, reply=b'{"id": "t1", "seq": 3, "state": "running"}')
    env = {"turn": {"id": "t1", "seq": 3, "token": "turn-secret"}, "ticket": {"id": "k"}}
    with TurnAgent(server.url, env, token="fallback") as turn:
        turn.heartbeat()
    bare = {"turn": {"id": "t1", "seq": 3}}
    with TurnAgent(server.url, bare, token="fallback") as turn:
        turn.heartbeat()
    assert [(path, h["Authorization"]) for path, h, _ in server.requests] == [
        ("/api/v1/turns/t1/heartbeat", "Bearer turn-secret"),
        ("/api/v1/turns/t1/heartbeat", "Bearer fallback"),
    ]
    with pytest.raises(ValueError, match="no turn token"):
        TurnAgent(server.url, bare)
