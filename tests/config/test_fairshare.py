"""Fair share per caller (core/fairshare.py): admissions per window,
requests in flight and ``wait_s`` waits per user, counted in the test
Redis; a counter store that is away lets requests through (fail open)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from accounts.keys import create_api_key
from core import fairshare
from runtime import services as runtime_services
from tests.conftest import wait_for
from tickets.models import Ticket


@pytest.fixture
def fair_share(settings):
    """The limits on (the suite runs with them off: tests/conftest.py), the
    counters empty, the fail-open state of this process fresh."""
    settings.RATE_LIMIT_ADMISSIONS = "10/second;300/minute"
    settings.RATE_LIMIT_CONCURRENT_REQUESTS = 8
    settings.RATE_LIMIT_CONCURRENT_WAITS = 4
    settings.API_WAIT_SLOTS = 2
    fairshare.storage().reset()
    fairshare._State.down_until = 0.0
    fairshare._State.logged_at = float("-inf")
    yield settings
    fairshare._State.down_until = 0.0


def _key(username: str) -> str:
    return create_api_key(username=username, staff=True)[1]


@pytest.mark.django_db
def test_admissions_over_the_window_are_429_with_the_ratelimit_headers(
    api, make_endpoint, fair_share
):
    make_endpoint("metered")
    fair_share.RATE_LIMIT_ADMISSIONS = "3/minute"
    for n in range(3):
        assert api.post("/tickets", {"endpoint": "metered", "input": {"n": n}}).status_code == 201
    refused = api.post("/tickets", {"endpoint": "metered", "input": {"n": 3}})
    assert refused.status_code == 429, refused.content
    body = refused.json()
    assert body["error"] == "rate_limited" and "RATE_LIMIT_ADMISSIONS" in body["detail"]
    assert body["limit"] == 3 and 1 <= body["retry_after"] <= 60
    assert refused["Retry-After"] == str(body["retry_after"])
    assert (refused["RateLimit-Limit"], refused["RateLimit-Remaining"]) == ("3", "0")
    assert refused["RateLimit-Reset"] == refused["Retry-After"]
    assert Ticket.objects.filter(endpoint__address="metered").count() == 3  # nothing written
    # Another user's share is their own.
    other = api.as_key(_key("other-tenant"))
    assert other.post("/tickets", {"endpoint": "metered", "input": {"n": 4}}).status_code == 201


def test_requests_and_waits_in_flight_are_limited_per_user(
    live_server, make_endpoint, fair_share, transactional_db
):
    """A's wait holds a thread; A's next wait answers at once with its
    ticket (per user: one wait), so does B's (per process: one slot); over
    A's requests in flight A is 429 while B is served; once A's wait ends,
    A is served again."""
    fair_share.RATE_LIMIT_CONCURRENT_WAITS = 1
    fair_share.API_WAIT_SLOTS = 1
    make_endpoint("idle")  # no worker runs: its tickets stay queued
    a_key, b_key = _key("tenant-a"), _key("tenant-b")
    base = f"{live_server.url}/api/v1"
    a = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {a_key}"}, timeout=60)
    b = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {b_key}"}, timeout=60)
    held: dict[str, httpx.Response] = {}

    def long_poll() -> None:
        held["a"] = a.post("/tickets", json={"endpoint": "idle", "input": {}, "wait_s": 50})

    waiter = threading.Thread(target=long_poll, daemon=True)
    waiter.start()
    redis = fairshare.storage().storage
    a_user = Ticket.submitted_by.field.related_model.objects.get(username="tenant-a")
    waits_key = f"{fairshare.KEY_PREFIX}:waits:{fairshare.subject(a_user)}"
    try:
        wait_for(lambda: redis.zcard(waits_key) == 1, message="A's wait to hold its slot")

        for client in (a, b):
            started = time.monotonic()
            r = client.post("/tickets", json={"endpoint": "idle", "input": {}, "wait_s": 50})
            assert r.status_code == 201 and r.json()["state"] == "queued", r.text
            assert time.monotonic() - started < 10  # at once, not after wait_s

        fair_share.RATE_LIMIT_CONCURRENT_REQUESTS = 1  # A's waiting request is its one
        refused = a.get("/tickets")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == "rate_limited"
        assert "RATE_LIMIT_CONCURRENT_REQUESTS" in refused.json()["detail"]
        assert (
            int(refused.headers["Retry-After"]) >= 1 and refused.headers["RateLimit-Limit"] == "1"
        )
        assert b.get("/tickets").status_code == 200

        # B ends A's wait (a cancel is terminal); A's share comes back.
        first = wait_for(
            lambda: Ticket.objects.filter(submitted_by=a_user).order_by("created_at").first()
        )
        assert b.post(f"/tickets/{first.id}/cancel").status_code == 200
        waiter.join(timeout=30)
        assert held["a"].status_code == 201 and held["a"].json()["state"] == "cancelled"
        assert a.get("/tickets").status_code == 200
    finally:
        waiter.join(timeout=60)
        a.close()
        b.close()


@pytest.mark.django_db
def test_an_unreachable_counter_store_fails_open_with_one_warning(
    api, make_endpoint, fair_share, caplog
):
    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fair_share.RATE_LIMIT_STORAGE_URL = f"redis://127.0.0.1:{port}/0"
    fair_share.RATE_LIMIT_ADMISSIONS = "1/minute"
    fair_share.RATE_LIMIT_CONCURRENT_REQUESTS = 1
    make_endpoint("open")
    with caplog.at_level(logging.WARNING, logger="core.fairshare"):
        for n in range(3):
            r = api.post("/tickets", {"endpoint": "open", "input": {"n": n}})
            assert r.status_code == 201, r.content
    lines = [r.getMessage() for r in caplog.records if r.name == "core.fairshare"]
    assert len(lines) == 1 and "unreachable" in lines[0] and "unlimited" in lines[0], lines


@pytest.mark.django_db
def test_mcp_counts_requests_in_flight_as_the_api_does(client, api, fair_share, staff_user):
    """Another request of the user in flight (a lease taken as the API takes
    one) and a limit of one: /mcp and the API both answer 429 until it ends."""
    fair_share.RATE_LIMIT_CONCURRENT_REQUESTS = 1
    subject = fairshare.subject(staff_user)
    member, _ = fairshare._acquire("requests", subject, 1)
    assert member
    call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    headers = {
        "HTTP_AUTHORIZATION": f"Bearer {api.key}",
        "HTTP_ACCEPT": "application/json, text/event-stream",
        "HTTP_MCP_PROTOCOL_VERSION": "2025-06-18",
    }
    refused = client.post("/mcp", call, content_type="application/json", **headers)
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
    assert refused["Retry-After"] == "1" and refused["RateLimit-Limit"] == "1"
    assert api.get("/tickets").status_code == 429
    fairshare._release("requests", subject, member)
    assert client.post("/mcp", call, content_type="application/json", **headers).status_code == 200
    assert api.get("/tickets").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_mcp_waits_take_a_wait_slot_and_none_free_is_rate_limited(
    client, api, fair_share, staff_user, make_endpoint, monkeypatch
):
    """``wait_for_ticket`` holds a wait slot of the user (and of the process)
    while it waits, like the API's ``wait_s``; with none free it is a tool
    error with the API's 429 ``rate_limited`` body, naming the limit."""
    from tickets import api as tickets_api
    from tickets.admission import admit_ticket

    make_endpoint("idle")  # no worker: its ticket stays queued
    ticket = admit_ticket(endpoint="idle", input={}, submitted_by_id=staff_user.id).ticket
    fair_share.RATE_LIMIT_CONCURRENT_WAITS = 1
    subject = fairshare.subject(staff_user)
    waits_key = f"{fairshare.KEY_PREFIX}:waits:{subject}"
    redis = fairshare.storage().storage
    headers = {
        "HTTP_AUTHORIZATION": f"Bearer {api.key}",
        "HTTP_ACCEPT": "application/json, text/event-stream",
        "HTTP_MCP_PROTOCOL_VERSION": "2025-06-18",
    }

    def wait_for_ticket(wait_s: float) -> dict:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "wait_for_ticket",
                "arguments": {"ticket_id": str(ticket.id), "wait_s": wait_s},
            },
        }
        response = client.post("/mcp", json.dumps(body), content_type="application/json", **headers)
        assert response.status_code == 200, response.content
        return response.json()["result"]

    held_while_waiting = []
    real_wait = tickets_api.wait_for_terminal

    def watched(t, wait_s):
        held_while_waiting.append(redis.zcard(waits_key))
        return real_wait(t, wait_s)

    monkeypatch.setattr(tickets_api, "wait_for_terminal", watched)
    result = wait_for_ticket(0.2)
    assert result["isError"] is False and result["structuredContent"]["state"] == "queued"
    assert held_while_waiting == [1] and redis.zcard(waits_key) == 0  # taken, then given back

    # Another wait of the user's holds its one slot.
    member, _ = fairshare._acquire("waits", subject, 1)
    assert member
    try:
        refused = wait_for_ticket(30)
        assert refused["isError"] is True
        body = refused["structuredContent"]
        assert (body["error"], body["status"], body["limit"], body["retry_after"]) == (
            "rate_limited",
            429,
            1,
            1,
        )
        assert "RATE_LIMIT_CONCURRENT_WAITS" in body["detail"]
        assert held_while_waiting == [1]  # no wait began
    finally:
        fairshare._release("waits", subject, member)
    # The process's own slots full: the same error, naming API_WAIT_SLOTS.
    fair_share.API_WAIT_SLOTS = 0
    body = wait_for_ticket(30)["structuredContent"]
    assert body["error"] == "rate_limited" and "API_WAIT_SLOTS" in body["detail"]
    # A ticket already ended needs no wait, and no slot.
    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test")
    done = wait_for_ticket(30)
    assert done["isError"] is False and done["structuredContent"]["state"] == "cancelled"
