"""The MCP server at /mcp (config/mcp.py, tickets/mcp.py) through the
official ``mcp`` client over real HTTP: pytest-django's live server on real
PostgreSQL, and a real worker where a ticket must run.

The ledger is set up before the client's event loop runs and read after it:
Django's ORM refuses to run inside one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.client.conftest import Ledger

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def key_of(username: str, **kw) -> str:
    from accounts.keys import create_api_key

    return create_api_key(username=username, **kw)[1]


@contextlib.asynccontextmanager
async def connect(url: str, key: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client on Streamable HTTP, sending ``key`` as the API does."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=90)) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, structured result); the text content says the same."""
    result = await client.call_tool(tool, arguments)
    assert json.loads(result.content[0].text) == result.structured_content
    return result.is_error, result.structured_content


def not_found(ticket_id) -> tuple[bool, dict]:
    return True, {"error": "not_found", "detail": f"ticket {ticket_id} not found", "status": 404}


def test_submit_wait_and_lineage_and_a_stranger_finds_nothing(
    worker, live_server, make_endpoint, django_user_model
):
    for name in ("alice", "mallory"):
        django_user_model.objects.create_user(name)
    make_endpoint("demo.echo", owners=["alice"])
    make_endpoint("demo.research", path="runtime.demo.research", owners=["alice"])
    alice, mallory = key_of("alice"), key_of("mallory")

    async def as_alice() -> dict[str, Any]:
        async with connect(live_server.url, alice) as client:
            # The client discovers the current protocol revision (no handshake).
            assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names >= {
                "submit_ticket",
                "get_ticket",
                "wait_for_ticket",
                "list_tickets",
                "search_tickets",
                "get_ticket_events",
                "get_lineage",
                "cancel_ticket",
            }
            args = {"endpoint": "demo.research", "input": {"children": 2}, "dedupe_key": "mcp-1"}
            error, ticket = await call(client, "submit_ticket", **args)
            assert not error and ticket["duplicate"] is False
            error, again = await call(client, "submit_ticket", **args)
            assert not error and (again["id"], again["duplicate"]) == (ticket["id"], True)

            # Two requests at once (two server threads, one SDK server): the
            # wait, and a read while it waits.
            (error, done), (read_error, read) = await asyncio.gather(
                call(client, "wait_for_ticket", ticket_id=ticket["id"], wait_s=60),
                call(client, "get_ticket", ticket_id=ticket["id"]),
            )
            assert not error and done["state"] == "succeeded", done
            assert not read_error and read["id"] == ticket["id"]
            error, lineage = await call(client, "get_lineage", ticket_id=ticket["id"])
            assert not error and lineage["root"] == ticket["id"]
            children = [n for n in lineage["nodes"] if n["parent"] == ticket["id"]]
            assert [(c["endpoint"], c["state"]) for c in children] == [
                ("demo.echo", "succeeded")
            ] * 2
            error, events = await call(client, "get_ticket_events", ticket_id=ticket["id"])
            assert not error and events["events"][-1]["to_state"] == "succeeded"
            # The root, and the callbacks its children sent back to it.
            error, page = await call(client, "list_tickets", endpoint="demo.research")
            assert not error and page["items"][-1]["id"] == ticket["id"]
            assert {t["endpoint"] for t in page["items"]} == {"demo.research"}
            error, found = await call(client, "search_tickets", q="mcp-1")
            assert not error and [t["id"] for t in found["items"]] == [ticket["id"]]
            return ticket

    ticket = asyncio.run(as_alice())
    ticket_id = ticket["id"]

    async def as_mallory() -> None:
        async with connect(live_server.url, mallory) as client:
            # Alice's ticket does not exist for Mallory: every tool answers
            # exactly what an unknown id gets.
            unknown = str(uuid.uuid4())
            assert await call(client, "get_ticket", ticket_id=unknown) == not_found(unknown)
            for tool, extra in (
                ("get_ticket", {}),
                ("wait_for_ticket", {"wait_s": 1}),
                ("get_ticket_events", {}),
                ("get_lineage", {}),
                ("cancel_ticket", {}),
            ):
                assert await call(client, tool, ticket_id=ticket_id, **extra) == not_found(
                    ticket_id
                ), tool
            # Lists and searches leave it out; the same dedupe key on the same
            # endpoint is Mallory's own ticket, not a conflict that names Alice's.
            assert await call(client, "list_tickets") == (False, {"items": [], "next_cursor": None})
            for q in ("mcp-1", ticket_id, ticket["trace_id"]):
                error, found = await call(client, "search_tickets", q=q)
                assert (error, found["items"]) == (False, []), q

    asyncio.run(as_mallory())


def test_without_a_valid_key_mcp_is_401(live_server):
    url = f"{live_server.url}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer cc_nope_nope"}, {"Authorization": "Basic eDp5"}):
        answer = httpx.post(url, json=body, headers={**headers, **auth})
        assert answer.status_code == 401
        assert answer.json()["error"] == "unauthenticated"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    # No event stream and no sessions: GET and DELETE are 405 (before any key is read).
    for method in ("GET", "DELETE"):
        answer = httpx.request(method, url)
        assert (answer.status_code, answer.headers["Allow"]) == (405, "POST")

    async def with_a_wrong_key() -> None:
        async with connect(live_server.url, "cc_wrong_key") as client:
            await client.list_tools()

    with pytest.raises(Exception):  # noqa: B017 - the SDK reports the 401 its own way
        asyncio.run(with_a_wrong_key())


def test_bad_input_is_a_tool_error_with_the_apis_code(
    live_server, make_endpoint, api_key, settings
):
    make_endpoint("mcp.echo")  # no worker: its tickets stay queued
    make_endpoint("mcp.stuck", path="runtime.demo.stuck", interrupt_grace_s=0.05)
    case = Ledger().quarantine("mcp.stuck")
    settings.ADMISSION_MAX_WAIT_S = 20  # the live server runs in this process

    def invalid(field: str) -> Any:
        return lambda r: r["error"] == "invalid" and field in r["detail"]

    async def calls() -> None:
        # The initialize handshake of the 2025 protocol revisions (the other
        # test's client discovers the current one).
        async with connect(live_server.url, api_key, mode="legacy") as client:
            assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            args = {"endpoint": "mcp.echo", "input": {}, "dedupe_key": "d"}
            error, queued = await call(client, "submit_ticket", **args)
            assert not error
            # A wait is bounded: the ticket as it stands when wait_s ends.
            started = time.monotonic()
            error, still = await call(client, "wait_for_ticket", ticket_id=queued["id"], wait_s=0.5)
            assert (error, still["state"]) == (False, "queued")
            assert 0.5 <= time.monotonic() - started < 10
            error, _ = await call(client, "cancel_ticket", ticket_id=queued["id"])
            assert not error

            S, key = "submit_ticket", {"endpoint": "mcp.echo", "input": {}}
            submit = {**key, "input": {"x": 1}, "dedupe_key": "k"}
            cancelled = {"ticket_id": queued["id"]}
            too_deep: dict[str, Any] = {"a": 1}
            for _ in range(64):  # 65 levels: one past TICKET_MAX_JSON_DEPTH
                too_deep = {"a": too_deep}
            cases = [
                (S, {**submit, "input": "text"}, 422, invalid("input")),
                (S, {**submit, "colour": "red"}, 422, invalid("colour")),
                (S, key, 422, invalid("dedupe_key")),
                (S, {**submit, "input": {"a": "x\x00y"}}, 400, invalid("arguments.input.a")),
                (S, {**submit, "input": too_deep}, 400, invalid("arguments.input is nested")),
                (S, {**submit, "dedupe_key": "tab\there"}, 400, invalid("dedupe_key")),
                (S, {**submit, "wait_s": 21}, 400, invalid("wait_s")),
                (S, {**submit, "wait_s": 61}, 422, invalid("wait_s")),
                (S, {**submit, "endpoint": "mcp.nowhere"}, 404, None),
                (S, {**submit, "dedupe_key": "d"}, 409, lambda r: r["ticket"] == queued["id"]),
                (S, {**submit, "endpoint": "mcp.stuck"}, 423, lambda r: r["case"] == case),
                (S, {**submit, "input": {"x": "y" * 70_000}}, 413, None),
                ("cancel_ticket", cancelled, 409, lambda r: r["state"] == "cancelled"),
                ("wait_for_ticket", {**cancelled, "wait_s": 61}, 422, invalid("wait_s")),
                ("wait_for_ticket", {**cancelled, "wait_s": 21}, 400, invalid("at most 20")),
                ("wait_for_ticket", {**cancelled, "wait_s": "soon"}, 422, invalid("wait_s")),
                ("list_tickets", {"limit": 0}, 422, invalid("limit")),
                ("list_tickets", {"state": "sleeping"}, 400, invalid("state")),
                ("list_tickets", {"cursor": "not-ours"}, 400, invalid("cursor")),
                ("search_tickets", {"q": ""}, 422, invalid("q")),
                ("get_lineage", {}, 422, invalid("ticket_id")),
                ("no_such_tool", {}, 404, None),
            ]
            for tool, arguments, status, check in cases:
                error, answer = await call(client, tool, **arguments)
                assert error and answer["status"] == status, (tool, arguments, answer)
                assert answer["detail"], answer
                assert check is None or check(answer), (tool, arguments, answer)

    asyncio.run(calls())

    # Malformed JSON-RPC is the protocol's own 4xx, never a 500.
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    for raw in (b"{", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": 5}'):
        answer = httpx.post(f"{live_server.url}/mcp", content=raw, headers=headers)
        assert 400 <= answer.status_code < 500, (raw, answer.status_code, answer.text)
