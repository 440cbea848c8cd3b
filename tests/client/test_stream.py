"""``GET /tickets/{id}/stream`` through the Python client's ``stream()``,
against the real app (live server, PostgreSQL, the LISTEN hub) and a real
worker running an agent whose tools the test holds mid-turn: a client that
drops mid-turn resumes with ``Last-Event-ID`` and gets every event exactly
once, a late client gets the whole history, a stranger gets 404, a caller
over its streams limit gets 429, and a stream the server ends after
``STREAM_MAX_S`` is resumed by the client."""

from __future__ import annotations

import threading

import httpx
import pytest

from claimcheck_client import AsyncClient, Client, NotFound, Step
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = {"kind": "agent", "framework": "pydantic_ai", "path": "tests.agents.steps_agent.build"}


def ledger_ids(steps: list[Step]) -> list[int]:
    return [s.id for s in steps if s.id is not None]


@pytest.mark.integration
def test_a_client_dropped_mid_turn_resumes_and_gets_every_event_once(
    server, api_key, worker, endpoint, ledger, tmp_path
):
    address = endpoint("steps.agent", runner=STEPS)
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"prompt": f"steps {tmp_path} 3"})
        before: list[Step] = []
        for step in cc.stream(ticket.id):
            before.append(step)
            if step.kind == "tool_started" and step.data["detail"]["args"]["i"] == 2:
                break  # the connection closes here, while step 2 waits for the gate
        assert ledger.event_ids(ticket.id)[-1][1] == "tool_started"  # mid-turn
        (tmp_path / "open").touch()
        after = list(cc.stream(ticket.id, last_event_id=before[-1].id))

    streamed = ledger_ids(before) + ledger_ids(after)
    assert len(streamed) == len(set(streamed))  # nothing twice
    assert [(s.id, s.kind) for s in before + after if s.id is not None] == ledger.event_ids(
        ticket.id
    )  # nothing missed, in the ledger's order
    tools = [
        (
            s.kind,
            s.data["detail"]["args"]["i"]
            if s.kind == "tool_started"
            else s.data["detail"]["status"],
        )
        for s in before + after
        if s.kind.startswith("tool_")
    ]
    assert tools == [
        ("tool_started", 1), ("tool_ended", "ok"),
        ("tool_started", 2), ("tool_ended", "ok"),
        ("tool_started", 3), ("tool_ended", "ok"),
    ]  # fmt: skip
    assert after[-1].kind == "end" and after[-1].data == {"state": "succeeded"}
    assert [s.kind for s in after].count("end") == 1


@pytest.mark.integration
def test_a_client_that_comes_after_the_end_gets_the_whole_history(
    server, api_key, worker, endpoint, ledger, tmp_path
):
    address = endpoint("steps.late", runner=STEPS)
    (tmp_path / "open").touch()
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"prompt": f"steps {tmp_path} 2"})
        assert cc.wait(ticket.id, timeout=60).state == "succeeded"
        steps = list(cc.stream(ticket.id))
    assert [(s.id, s.kind) for s in steps[:-1]] == ledger.event_ids(ticket.id)
    assert [s.kind for s in steps].count("tool_ended") == 2
    assert steps[-1].kind == "end" and steps[-1].data == {"state": "succeeded"}
    assert steps[0].event is not None and steps[0].event.kind == "admitted"


@pytest.mark.integration
def test_the_async_client_streams_the_same_steps(server, api_key, worker, endpoint, ledger):
    import asyncio

    address = endpoint("stream.echo")  # runtime.demo.echo

    async def run() -> tuple[str, list[Step]]:
        async with AsyncClient(server, api_key) as cc:
            ticket = await cc.submit(address, {"hello": "stream"})
            return ticket.id, [s async for s in cc.stream(ticket.id)]

    ticket_id, steps = asyncio.run(run())
    assert [(s.id, s.kind) for s in steps[:-1]] == ledger.event_ids(ticket_id)
    assert steps[-1].data == {"state": "succeeded"}


def test_a_strangers_stream_is_404_before_anything_is_streamed(server, api_key, user_key, endpoint):
    address = endpoint("stream.private")  # no worker: it stays queued
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"n": 1})
        owned = cc.stream(ticket.id)
        assert next(owned).kind == "admitted"  # its submitter's stream is open
        owned.close()
    stranger = user_key("stranger")
    with Client(server, stranger, retries=0) as other, pytest.raises(NotFound) as info:
        next(iter(other.stream(ticket.id)))
    assert info.value.code == "not_found"
    answer = httpx.get(
        f"{server}/api/v1/tickets/{ticket.id}/stream",
        headers={"Authorization": f"Bearer {stranger}"},
    )
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["error"] == "not_found"


def test_over_the_streams_limit_is_429_and_a_closed_stream_frees_its_slot(
    server, api_key, endpoint, settings
):
    settings.RATE_LIMIT_CONCURRENT_STREAMS = 1
    settings.STREAM_HEARTBEAT_S = 0.2  # the server notices a gone reader at its next write
    address = endpoint("stream.limited")
    url_of = lambda t: f"{server}/api/v1/tickets/{t}/stream"  # noqa: E731
    auth = {"Authorization": f"Bearer {api_key}"}
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"n": 1})
        first = cc.stream(ticket.id)
        assert next(first).kind == "admitted"  # the slot is held now

        refused = httpx.get(url_of(ticket.id), headers=auth)
        assert refused.status_code == 429
        assert refused.json()["error"] == "rate_limited"
        assert "RATE_LIMIT_CONCURRENT_STREAMS" in refused.json()["detail"]
        assert refused.headers["Retry-After"] == "1"

        first.close()  # the client goes away; the server's next heartbeat fails

        def admitted() -> bool:
            with httpx.stream("GET", url_of(ticket.id), headers=auth) as answer:
                return answer.status_code == 200

        wait_for(admitted, timeout=10, message="the closed stream's slot to be released")


def test_a_stream_ended_at_its_max_duration_is_resumed_by_the_client(
    server, api_key, endpoint, settings
):
    settings.STREAM_MAX_S = 0.3
    address = endpoint("stream.short")  # no worker: queued until cancelled
    seen: list[httpx.Request] = []

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return super().handle_request(request)

    with Client(server, api_key, transport=Counting()) as cc:
        ticket = cc.submit(address, {"n": 1})
        steps: list[Step] = []
        reader = threading.Thread(target=lambda: steps.extend(cc.stream(ticket.id)))
        reader.start()
        streams = lambda: [r for r in seen if r.url.path.endswith("/stream")]  # noqa: E731
        wait_for(lambda: len(streams()) >= 3, timeout=20, message="the client to reconnect twice")
        cc.cancel(ticket.id)
        reader.join(timeout=20)
        assert not reader.is_alive()
    assert [s.kind for s in steps] == ["admitted", "cancelled", "end"]
    assert steps[-1].data == {"state": "cancelled"}
    # Every reconnect named the last event it had.
    resumed = [r.headers.get("Last-Event-ID") for r in streams()[1:]]
    assert set(resumed) <= {str(steps[0].id), str(steps[1].id)} and None not in resumed


def test_a_last_event_id_that_is_not_an_id_is_400(server, api_key, endpoint):
    address = endpoint("stream.bad")
    with Client(server, api_key) as cc:
        ticket = cc.submit(address, {"n": 1})
    answer = httpx.get(
        f"{server}/api/v1/tickets/{ticket.id}/stream",
        headers={"Authorization": f"Bearer {api_key}", "Last-Event-ID": "12abc"},
    )
    assert answer.status_code == 400 and answer.json()["error"] == "invalid"


@pytest.mark.integration
def test_the_streaming_example_runs_against_the_demo_agent(server, api_key, worker, endpoint):
    """docs/howto/streaming.md's example, as a user runs it (its own process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    endpoint(
        "demo.agent",
        runner={"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"},
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "CLAIMCHECK_URL": server, "CLAIMCHECK_KEY": api_key}
    done = subprocess.run(
        [sys.executable, "examples/stream_ticket.py", "slow 0.2"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(" tool_started: slow(" in line for line in lines), done.stdout
    assert any(" tool_ended: slow ok in " in line for line in lines), done.stdout
    assert "end: succeeded" in lines, done.stdout


def test_the_parser_reads_ids_kinds_comments_and_multi_line_data():
    from claimcheck_client._sse import Parser

    parser = Parser()
    lines = [
        "retry: 1000", "",  # no data: no step
        ": keep-alive", "",
        "id: 7", "event: tool_started", 'data: {"kind": "tool_started",', 'data: "detail": {}}', "",
        "event: delta", 'data: {"text": "hel"}', "",
        "id: x1", "event: odd", "data: {}", "",  # an id that is not a number is not one
        "event: end", 'data: {"state": "succeeded"}', "",
    ]  # fmt: skip
    steps = [s for s in map(parser.feed, lines) if s is not None]
    assert [(s.kind, s.id) for s in steps] == [
        ("tool_started", 7), ("delta", None), ("odd", None), ("end", None)
    ]  # fmt: skip
    assert steps[0].data == {"kind": "tool_started", "detail": {}}
    assert steps[1].event is None and steps[-1].is_end


def test_the_async_client_resumes_a_stream_ended_at_its_max_duration(
    server, api_key, endpoint, settings
):
    import asyncio

    settings.STREAM_MAX_S = 0.3
    address = endpoint("stream.async-short")  # no worker: queued until cancelled
    opened: list[httpx.Request] = []

    async def log(request: httpx.Request) -> None:
        if request.url.path.endswith("/stream"):
            opened.append(request)

    async def run() -> list[Step]:
        async with AsyncClient(server, api_key) as cc:
            cc._http.event_hooks["request"].append(log)
            ticket = await cc.submit(address, {"n": 1})

            async def cancel_after_reconnects() -> None:
                while len(opened) < 3:
                    await asyncio.sleep(0.05)
                await cc.cancel(ticket.id)

            canceller = asyncio.create_task(cancel_after_reconnects())
            steps = [s async for s in cc.stream(ticket.id)]
            await canceller
            return steps

    steps = asyncio.run(asyncio.wait_for(run(), timeout=30))
    assert [s.kind for s in steps] == ["admitted", "cancelled", "end"]
    assert all(r.headers.get("Last-Event-ID") == str(steps[0].id) for r in opened[1:-1])
