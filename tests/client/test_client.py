"""The Python client against the real app (live server, PostgreSQL; a real
worker where a ticket must run). Faults between client and server come from
a local proxy (tests/client/helpers.py)."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import pytest
from claimcheck_client._retry import parse_retry_after

from claimcheck_client import (
    CircuitOpen,
    Client,
    DedupeConflict,
    EndpointQuarantined,
    Forbidden,
    Invalid,
    InvalidTransition,
    NotFound,
    RateLimited,
    TooLarge,
    TransportError,
    Unauthenticated,
    Unavailable,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cc(server, api_key):
    with Client(server, api_key, backoff_base=0.05) as client:
        yield client


class Counting(httpx.HTTPTransport):
    """Counts the requests a client really sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        return super().handle_request(request)


# --- Retries -------------------------------------------------------------------------------


def test_submit_retries_after_a_dropped_connection_and_gets_one_ticket(
    proxy, api_key, endpoint, ledger
):
    endpoint("drop-echo")  # no worker: the ticket stays queued, which is all this needs
    p = proxy(["drop"])
    with Client(p.url, api_key, backoff_base=0.05) as cc:
        ticket = cc.submit("drop-echo", {"n": 1})

    # The server committed the first attempt and its answer was lost; the
    # repeat carried the same generated key and found that ticket.
    assert [s.action for s in p.seen] == ["drop", "forward"]
    first, second = (json.loads(s.body) for s in p.seen)
    assert first["dedupe_key"] == second["dedupe_key"] == ticket.dedupe_key
    uuid.UUID(ticket.dedupe_key)  # generated: a uuid4
    assert ticket.duplicate is True
    rows = ledger.tickets(endpoint__address="drop-echo")
    assert [str(r["id"]) for r in rows] == [ticket.id]


def test_a_dropped_answer_without_retries_is_an_ambiguous_transport_error(
    proxy, api_key, endpoint, ledger
):
    """Why the retry needs the same key: the first attempt did create the ticket."""
    endpoint("drop-once")
    p = proxy(["drop"])
    with Client(p.url, api_key, retries=0) as cc, pytest.raises(TransportError) as info:
        cc.submit("drop-once", {"n": 1}, dedupe_key="mine")
    assert info.value.ambiguous is True and info.value.status is None
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
    assert [r["dedupe_key"] for r in ledger.tickets(endpoint__address="drop-once")] == ["mine"]


def test_a_503_with_retry_after_is_retried_after_that_wait(proxy, api_key, endpoint, ledger):
    endpoint("busy-echo")
    p = proxy(["503"], retry_after="1")
    with Client(p.url, api_key) as cc:
        ticket = cc.submit("busy-echo", {"n": 2}, dedupe_key="k-503")
    assert [s.action for s in p.seen] == ["503", "forward"]
    assert p.seen[1].at - p.seen[0].at >= 1.0  # Retry-After: 1 was honoured
    assert json.loads(p.seen[0].body)["dedupe_key"] == json.loads(p.seen[1].body)["dedupe_key"]
    assert (ticket.duplicate, ticket.dedupe_key, ticket.state) == (False, "k-503", "queued")
    assert len(ledger.tickets(endpoint__address="busy-echo")) == 1


def test_503_until_the_retries_run_out_raises_unavailable(proxy, api_key, transactional_db):
    p = proxy(["503", "503", "503"], retry_after="0")
    with Client(p.url, api_key, retries=2) as cc, pytest.raises(Unavailable) as info:
        cc.get(uuid.uuid4())
    assert (info.value.status, info.value.code, info.value.retry_after) == (503, "unavailable", 0)
    assert len(p.seen) == 3


def test_connection_refused_is_retried_then_a_transport_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    counting = Counting()
    client = Client(
        f"http://127.0.0.1:{port}", "cc_x_y", retries=2, backoff_base=0.01, transport=counting
    )
    with client, pytest.raises(TransportError) as info:
        client.get(uuid.uuid4())
    assert len(counting.requests) == 3
    assert info.value.ambiguous is False  # the request never left this machine
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    later = parse_retry_after(
        time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    )
    assert 25 <= later <= 31


# --- Typed errors --------------------------------------------------------------------------


def test_dedupe_conflict_names_the_ticket_holding_the_key(cc, endpoint):
    endpoint("conflict")
    first = cc.submit("conflict", {"a": 1}, dedupe_key="same")
    again = cc.submit("conflict", {"a": 1}, dedupe_key="same")
    assert (again.id, again.duplicate) == (first.id, True)
    with pytest.raises(DedupeConflict) as info:
        cc.submit("conflict", {"a": 2}, dedupe_key="same")
    assert (info.value.status, info.value.code, info.value.ticket) == (
        409,
        "dedupe_conflict",
        first.id,
    )


def test_a_quarantined_endpoint_refuses_with_its_case(cc, endpoint, ledger):
    endpoint("q-stuck", path="runtime.demo.stuck", interrupt_grace_s=0.05)
    case = ledger.quarantine("q-stuck")
    with pytest.raises(EndpointQuarantined) as info:
        cc.submit("q-stuck", {"seconds": 1})
    assert (info.value.status, info.value.case) == (423, case)


def test_unknown_tickets_and_endpoints_are_not_found(cc, endpoint):
    with pytest.raises(NotFound) as info:
        cc.get(uuid.uuid4())
    assert (info.value.status, info.value.code) == (404, "not_found")
    with pytest.raises(NotFound):
        cc.lineage("not-a-uuid")
    with pytest.raises(NotFound):
        cc.submit("no-such-endpoint", {})


def test_a_wrong_key_is_unauthenticated(server, transactional_db):
    with Client(server, "cc_0000_nope") as cc, pytest.raises(Unauthenticated) as info:
        cc.get(uuid.uuid4())
    assert info.value.status == 401


def test_approving_without_owning_the_endpoint_is_forbidden(server, user_key, endpoint):
    endpoint("owned")
    with Client(server, user_key("plain")) as cc:
        ticket = cc.submit("owned", {"n": 1})
        with pytest.raises(Forbidden) as info:
            cc.approve(ticket.id)
    assert (info.value.status, info.value.code) == (403, "forbidden")


def test_cancelling_a_cancelled_ticket_is_an_invalid_transition(cc, endpoint, ledger):
    endpoint("cancel-me")
    ticket = cc.submit("cancel-me", {"n": 1})
    assert cc.cancel(ticket.id).state == "cancelled"
    with pytest.raises(InvalidTransition) as info:
        cc.cancel(ticket.id)
    assert (info.value.status, info.value.state, info.value.ambiguous) == (409, "cancelled", False)


def test_a_retry_whose_answer_was_lost_returns_the_one_retry(cc, proxy, api_key, endpoint, ledger):
    endpoint("retry-me")
    ticket = cc.submit("retry-me", {"n": 1})
    cc.cancel(ticket.id)
    p = proxy(["drop"])
    with Client(p.url, api_key, backoff_base=0.05) as flaky:
        retry = flaky.retry(ticket.id, reason="lost answer", input={"n": 2}, budget_s=5)
    assert (retry.retry_of, retry.input, retry.raw["budget_s"]) == (ticket.id, {"n": 2}, 5)
    assert [s.action for s in p.seen][:2] == ["drop", "forward"]
    assert cc.get(ticket.id).retry == retry.id
    assert ledger.events(ticket.id).count("retried") == 1


def test_too_large_invalid_and_circuit_open(cc, endpoint, settings):
    endpoint("limits")
    settings.TICKET_MAX_INPUT_BYTES = 100
    with pytest.raises(TooLarge) as info:
        cc.submit("limits", {"blob": "x" * 200})
    assert info.value.status == 413
    with pytest.raises(Invalid) as invalid:
        cc.submit("limits", {"n": 1}, wait_s=120)  # over the server's cap of 60
    assert invalid.value.status == 400 and "wait_s" in invalid.value.detail
    settings.TRACE_HARD_LIMIT = 2
    root = cc.submit("limits", {"n": 1})
    cc.submit("limits", {"n": 2}, parent=root.id)
    with pytest.raises(CircuitOpen) as breaker:
        cc.submit("limits", {"n": 3}, parent=root.id)
    assert (breaker.value.status, breaker.value.trace_id) == (429, root.trace_id)


def test_a_429_rate_limited_is_retried_after_its_retry_after(
    cc, server, api_key, endpoint, settings
):
    """Over the server's admission limit (core/fairshare.py, counted in
    Redis): the client waits the 429's Retry-After and repeats with the same
    key; with no retries left it raises RateLimited with the wait."""
    endpoint("metered")
    settings.RATE_LIMIT_ADMISSIONS = "1 per 2 seconds"
    cc.submit("metered", {"n": 1})
    started = time.monotonic()
    second = cc.submit("metered", {"n": 2}, dedupe_key="k-429")
    assert time.monotonic() - started >= 1.0  # Retry-After (2 s, less what had passed) honoured
    assert (second.duplicate, second.dedupe_key) == (False, "k-429")
    with Client(server, api_key, retries=0) as impatient, pytest.raises(RateLimited) as info:
        impatient.submit("metered", {"n": 3})
    assert (info.value.status, info.value.code, info.value.limit) == (429, "rate_limited", 1)
    assert 1 <= info.value.retry_after <= 2


# --- Reads ---------------------------------------------------------------------------------


def test_list_iterates_every_keyset_page_newest_first(cc, endpoint):
    endpoint("pages")
    ids = [cc.submit("pages", {"n": i}).id for i in range(5)]
    assert [t.id for t in cc.list(endpoint="pages", page_size=2)] == ids[::-1]
    items, cursor = cc.list_page(endpoint="pages", limit=2)
    assert [t.id for t in items] == ids[:2:-1] and cursor


def test_list_searches_inside_input(cc, endpoint):
    endpoint("searched")
    wanted = cc.submit("searched", {"customer": 42, "note": "two words"})
    cc.submit("searched", {"customer": 43})
    assert [t.id for t in cc.list(search='input.customer:42 input.note:"two words"')] == [wanted.id]
    assert cc.list_page(search="input.customer:44") == ([], None)
    with pytest.raises(Invalid) as info:
        cc.list_page(search="input.customer")
    assert (info.value.status, info.value.code) == (400, "invalid_search")
    assert info.value.body["field"] == "search"


def test_events_and_lineage_are_typed(cc, endpoint):
    endpoint("tree")
    root = cc.submit("tree", {"n": 0})
    child = cc.submit("tree", {"n": 1}, parent=root.id, return_to="tree")
    events = cc.events(child.id)
    assert [e.kind for e in events] == ["admitted"]
    assert events[0].to_state == "queued" and events[0].at is not None
    lineage = cc.lineage(child.id)
    assert (lineage.trace_id, lineage.root) == (root.trace_id, root.id)
    nodes = {n.id: n for n in lineage.nodes}
    assert nodes[child.id].parent == root.id and nodes[child.id].depth == 1
    assert child.return_to is not None and child.return_to.endpoint == "tree"
    assert child.callback.state == "pending"


# --- Waiting -------------------------------------------------------------------------------


@pytest.mark.integration
def test_wait_returns_the_terminal_ticket_by_long_polling(worker, server, api_key, endpoint):
    endpoint("w-sleep", path="runtime.demo.sleep")
    counting = Counting()
    with Client(server, api_key, transport=counting) as cc:
        ticket = cc.submit("w-sleep", {"seconds": 2})
        started = time.monotonic()
        done = cc.wait(ticket.id, timeout=60)
    assert done.id == ticket.id and done.is_terminal and done.state == "succeeded"
    assert done.result["interrupted"] is False and done.duplicate is False
    assert time.monotonic() - started < 30
    # The wait was one GET and a long poll or two, not a polling loop.
    waits = counting.requests[1:]
    assert waits[0] == ("GET", f"/api/v1/tickets/{ticket.id}")
    assert 1 <= len(waits) - 1 <= 3 and all(r == ("POST", "/api/v1/tickets") for r in waits[1:])


@pytest.mark.integration
def test_wait_gives_back_an_unfinished_ticket_at_its_deadline(worker, cc, endpoint):
    endpoint("w-long", path="runtime.demo.sleep")
    ticket = cc.submit("w-long", {"seconds": 10})
    started = time.monotonic()
    seen = cc.wait(ticket.id, timeout=0.5)
    assert not seen.is_terminal and seen.state in ("queued", "running")
    assert time.monotonic() - started < 3
    cc.cancel(ticket.id)


@pytest.mark.integration
def test_wait_polls_a_ticket_that_has_no_dedupe_key(worker, cc, endpoint, ledger):
    endpoint("w-echo")
    ticket_id = ledger.admit_without_key("w-echo", {"hi": 1})
    done = cc.wait(ticket_id, timeout=30)
    assert (done.state, done.result, done.dedupe_key) == ("succeeded", {"echo": {"hi": 1}}, None)
    assert len(ledger.tickets(endpoint__address="w-echo")) == 1  # waiting created nothing


# --- Writes whose answer was lost ----------------------------------------------------------


def test_a_cancel_whose_answer_was_lost_is_resolved_by_its_repeat(
    cc, proxy, api_key, endpoint, ledger
):
    endpoint("lost-cancel")
    ticket = cc.submit("lost-cancel", {"n": 1})
    p = proxy(["drop"])
    with Client(p.url, api_key, backoff_base=0.05) as flaky:
        cancelled = flaky.cancel(ticket.id)
    assert cancelled.state == "cancelled"
    assert [s.action for s in p.seen][:2] == ["drop", "forward"]
    assert ledger.events(ticket.id).count("cancelled") == 1


@pytest.mark.integration
def test_pull_delivery_is_acknowledged_once(worker, cc, proxy, api_key, endpoint):
    endpoint("pull-echo")
    ticket = cc.submit("pull-echo", {"n": 1}, wait_s=20)
    assert ticket.state == "succeeded" and ticket.delivery.state == "pending"
    p = proxy(["drop"])
    with Client(p.url, api_key, backoff_base=0.05) as flaky:
        acked = flaky.ack(ticket.id)  # the first ack landed; its repeat finds it done
    assert acked.delivery.state == "delivered"
    with pytest.raises(InvalidTransition) as info:
        cc.ack(ticket.id)
    assert info.value.body.get("delivery") == "delivered"
