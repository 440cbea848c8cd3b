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


# --- The defaults and a key's own limits ------------------------------------------------------


@pytest.fixture
def gunicorn_at_the_defaults(transactional_db, tmp_path):
    """gunicorn as deployed (deploy/gunicorn.conf.py) at ``make run``'s size,
    every fair-share setting left at its default."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import FAIR_SHARE_OFF, _test_env
    from tests.nginx import free_port

    root = Path(__file__).resolve().parents[2]
    port = free_port()
    env = {k: v for k, v in _test_env().items() if k not in FAIR_SHARE_OFF}
    env.update(GUNICORN_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY="2", GUNICORN_THREADS="8")
    fairshare.storage().reset()
    with open(tmp_path / "web.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application",
             "-c", str(root / "deploy" / "gunicorn.conf.py")],
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            # Plain HTTP, polled: verify=False spares loading the CA bundle
            # into a TLS context at every call (most of a poll's CPU).
            return httpx.get(f"{base}/healthz", timeout=5, verify=False).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=120, message="gunicorn to answer")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_fan_out_and_a_loader_of_one_key_are_not_refused_at_the_defaults(
    gunicorn_at_the_defaults, make_endpoint
):
    """50 submissions of one key at once (an orchestrator's fan-out), then a
    loader of 16 threads: every one admitted, none 429."""
    make_endpoint("fan-out")  # no worker: the tickets stay queued
    key = _key("orchestrator")
    url = f"{gunicorn_at_the_defaults}/api/v1/tickets"
    headers = {"Authorization": f"Bearer {key}"}
    statuses: list[int] = []
    lock = threading.Lock()

    def post(n: int) -> None:
        r = httpx.post(
            url, json={"endpoint": "fan-out", "input": {"n": n}}, headers=headers, timeout=60
        )
        with lock:
            statuses.append(r.status_code)

    gate = threading.Barrier(50)

    def at_once(n: int) -> None:
        gate.wait(timeout=60)
        post(n)

    threads = [threading.Thread(target=at_once, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(set(statuses)) == [201] and len(statuses) == 50, statuses

    statuses.clear()

    def loader(i: int) -> None:
        for n in range(10):
            post(1000 + i * 100 + n)

    threads = [threading.Thread(target=loader, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(set(statuses)) == [201] and len(statuses) == 160, statuses


@pytest.mark.django_db
def test_a_key_with_limits_of_its_own_is_counted_apart_under_them(api, make_endpoint, fair_share):
    """The user's plain keys share the setting's budget; a key staff gave
    its own limits has a budget of its own, and its 429 names it."""
    make_endpoint("metered")
    fair_share.RATE_LIMIT_ADMISSIONS = "2/minute"
    _, plain = create_api_key(username="tenant")
    _, other_plain = create_api_key(username="tenant")
    row, own = create_api_key(username="tenant", rate_limit_admissions="4/minute")
    assert row.rate_limit_admissions == "4/minute" and row.rate_limit_concurrent_requests is None

    def submit(key: str, n: int):
        return api.as_key(key).post("/tickets", {"endpoint": "metered", "input": {"n": n}})

    assert [submit(plain, n).status_code for n in range(2)] == [201, 201]
    assert submit(other_plain, 2).status_code == 429  # the user's budget, shared
    assert [submit(own, n).status_code for n in range(3, 7)] == [201] * 4
    refused = submit(own, 7)
    assert refused.status_code == 429 and refused.json()["limit"] == 4
    assert "this key's own limit" in refused.json()["detail"]

    # Its own requests in flight: a lease held on the key's subject fills a
    # limit of one, while the user's plain keys are not held by it.
    fair_share.RATE_LIMIT_CONCURRENT_REQUESTS = 5
    row, narrow = create_api_key(username="tenant", rate_limit_concurrent_requests=1)
    held, _ = fairshare._acquire("requests", f"key:{row.id}", 1)
    try:
        refused = api.as_key(narrow).get("/tickets")
        assert refused.status_code == 429 and refused.json()["limit"] == 1
        assert "this key's own limit" in refused.json()["detail"]
        assert api.as_key(plain).get("/tickets").status_code == 200
    finally:
        fairshare._release("requests", f"key:{row.id}", held)
    assert api.as_key(narrow).get("/tickets").status_code == 200
    # Served from the cache of verified keys, the limits still hold.
    fairshare._acquire("requests", f"key:{row.id}", 1)
    assert api.as_key(narrow).get("/tickets").status_code == 429


@pytest.mark.django_db
def test_create_api_key_takes_a_keys_own_limits_and_refuses_an_unreadable_rate():
    from io import StringIO

    from django.core.management import CommandError, call_command

    from accounts.models import ApiKey

    out, err = StringIO(), StringIO()
    call_command(
        "create_api_key", "loader", "--rate", "1000/second", "--concurrent-requests", "32",
        stdout=out, stderr=err,
    )  # fmt: skip
    row = ApiKey.objects.get(user__username="loader")
    assert (row.rate_limit_admissions, row.rate_limit_concurrent_requests) == ("1000/second", 32)
    assert "own limits: admissions 1000/second, 32 requests in flight" in err.getvalue()
    with pytest.raises(CommandError, match="couldn't parse"):
        call_command("create_api_key", "loader", "--rate", "lots", stdout=out, stderr=err)
    assert ApiKey.objects.filter(user__username="loader").count() == 1
