"""Traces belong to the viewers of their tickets (API.md "Traces belong to
their tickets' viewers"): a caller who may see no ticket of an existing
trace cannot add to it, by ``trace_id`` or ``traceparent``; its admission
starts a trace of its own, so its tickets never count against the other's
circuit breaker and no answer tells it how large the other's trace is."""

from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client

from accounts.keys import create_api_key
from core import tracing
from endpoints.services import create_endpoint
from tickets import traces
from tickets.models import Ticket, Trace

pytestmark = pytest.mark.django_db

TRACEPARENT = "00-{}-00f067aa0ba902b7-01"


def key_of(username: str) -> str:
    get_user_model().objects.create_user(username)
    return create_api_key(username=username)[1]


def post(key: str, body: dict, client: Client | None = None, **headers):
    extra = {f"HTTP_{k.upper()}": v for k, v in headers.items()}
    return (client or Client()).post(
        "/api/v1/tickets",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        **extra,
    )


@pytest.fixture
def world():
    create_endpoint(address="t.ep", runner={"kind": "python", "path": "runtime.demo.echo"})
    return {"victim": key_of("victim"), "stranger": key_of("stranger")}


def test_a_strangers_trace_id_neither_joins_nor_counts_nor_reveals_the_size(world, settings):
    def to_order_42(key: str, **input_):
        return post(key, {"endpoint": "t.ep", "input": input_, "trace_id": "order-42"})

    settings.TRACE_HARD_LIMIT = 5
    settings.TRACE_SOFT_LIMIT = 3
    for i in range(3):
        resp = to_order_42(world["victim"], i=i)
        assert resp.status_code == 201 and resp.json()["trace_id"] == "order-42"

    # The stranger gets exactly the hard limit on its own trace, whatever the
    # size of the victim's: the count of admissions before the 429 says nothing.
    theirs = set()
    for i in range(settings.TRACE_HARD_LIMIT):
        resp = to_order_42(world["stranger"], s=i)
        assert resp.status_code == 201, resp.content
        theirs.add(resp.json()["trace_id"])
    assert len(theirs) == 1 and "order-42" not in theirs  # one trace of its own, kept
    refused = to_order_42(world["stranger"], s=99)
    assert refused.status_code == 429 and refused.json()["error"] == "circuit_open"
    assert "order-42" not in refused.content.decode()

    # The victim's trace holds only the victim's tickets; its breaker is untouched.
    assert Trace.objects.get(id="order-42").tickets == 3
    assert set(
        Ticket.objects.filter(trace_id="order-42").values_list("submitted_by__username", flat=True)
    ) == {"victim"}
    assert (to_order_42(world["victim"], i=3)).status_code == 201
    # The stranger's own view of "order-42" is empty; the ticket keeps the
    # name it asked for as a link.
    listed = Client().get(
        "/api/v1/tickets?trace_id=order-42", HTTP_AUTHORIZATION=f"Bearer {world['stranger']}"
    )
    assert listed.json()["items"] == []
    mine = Ticket.objects.filter(submitted_by__username="stranger").first()
    assert mine.requester["trace_link"] == {"trace_id": "order-42"}


def test_a_strangers_traceparent_starts_a_trace_of_its_own(world, settings):
    settings.TRACE_HARD_LIMIT = 3
    w3c = "4bf92f3577b34da6a3ce929d0e0e4736"
    header = TRACEPARENT.format(w3c)
    for i in range(2):
        resp = post(world["victim"], {"endpoint": "t.ep", "input": {"i": i}}, traceparent=header)
        assert resp.status_code == 201 and resp.json()["trace_id"] == w3c
    assert Trace.objects.get(id=w3c).tickets == 2
    codes = [
        post(world["stranger"], {"endpoint": "t.ep", "input": {"s": i}}, traceparent=header)
        for i in range(settings.TRACE_HARD_LIMIT + 1)
    ]
    assert [r.status_code for r in codes] == [201] * settings.TRACE_HARD_LIMIT + [429]
    own = codes[0].json()["trace_id"]
    assert own != w3c and all(r.json().get("trace_id", own) == own for r in codes[:-1])
    # The answer's traceparent is the stranger's trace; the caller's is the link.
    assert codes[0]["traceparent"].split("-")[1] == tracing.w3c_trace_id(own)
    mine = Ticket.objects.get(id=codes[0].json()["id"])
    assert mine.requester["trace_link"] == {"trace_id": w3c, "traceparent": header}
    assert Trace.objects.get(id=w3c).tickets == 2
    again = post(world["victim"], {"endpoint": "t.ep", "input": {"i": 9}}, traceparent=header)
    assert again.status_code == 201 and again.json()["trace_id"] == w3c


def test_whoever_sees_a_ticket_of_the_trace_may_add_to_it(world):
    first = post(world["victim"], {"endpoint": "t.ep", "input": {}, "trace_id": "shared"})
    assert first.status_code == 201
    # The endpoint's owner sees the victim's ticket, so it joins the trace.
    get_user_model().objects.create_user("olive")
    owner_key = create_api_key(username="olive")[1]
    from endpoints.services import update_endpoint

    update_endpoint(address="t.ep", changes={"owners": ["olive"]})
    joined = post(owner_key, {"endpoint": "t.ep", "input": {"o": 1}, "trace_id": "shared"})
    assert joined.status_code == 201 and joined.json()["trace_id"] == "shared"
    assert "trace_link" not in joined.json()["requester"]


def test_a_parent_the_caller_cannot_see_is_404(world):
    theirs = post(world["victim"], {"endpoint": "t.ep", "input": {}}).json()
    resp = post(world["stranger"], {"endpoint": "t.ep", "input": {}, "parent": theirs["id"]})
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    assert traces.counted(theirs["trace_id"]) == 1


@pytest.mark.django_db(transaction=True)
def test_callers_racing_to_start_one_trace_never_share_it():
    """Eight callers who see nothing of each other's post the same new trace
    id at once, several rounds: each trace ends up holding one caller's
    tickets only. A check that read "no such trace" without serialising the
    first admissions would let two of them in."""
    create_endpoint(address="t.race", runner={"kind": "python", "path": "runtime.demo.echo"})
    n, rounds = 8, 4
    keys = [key_of(f"racer{i}") for i in range(n)]
    errors: list = []
    for r in range(rounds):
        barrier = threading.Barrier(n)

        def admit(i: int, r: int = r, barrier: threading.Barrier = barrier) -> None:
            try:
                client = Client()
                barrier.wait()
                body = {"endpoint": "t.race", "input": {"i": i}, "trace_id": f"race-{r}"}
                resp = post(keys[i], body, client)
                if resp.status_code != 201:
                    errors.append(resp.content)
            except Exception as exc:  # surfaced below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=admit, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert Ticket.objects.filter(endpoint__address="t.race").count() == n * rounds
    for r in range(rounds):
        owners = set(
            Ticket.objects.filter(trace_id=f"race-{r}").values_list("submitted_by_id", flat=True)
        )
        assert len(owners) == 1, f"trace race-{r} is shared by {len(owners)} callers"
    by_trace: dict[str, set] = {}
    for trace_id, user_id in Ticket.objects.values_list("trace_id", "submitted_by_id"):
        by_trace.setdefault(trace_id, set()).add(user_id)
    assert all(len(users) == 1 for users in by_trace.values()), by_trace
