"""A trace's circuit breaker counts per party (docs/reference/api.md "A trace's
breaker counts per party"): each submitter may add ``TRACE_HARD_LIMIT``
tickets to a trace, and a ticket the runtime admits (a child, a callback, a
re-run) counts for the party of the ticket it descends from. So the owner of
an endpoint a trace reached, who may add to the trace because it sees a
ticket in it, can exhaust only its own share, never the root's."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.keys import create_api_key
from core.errors import CircuitOpen
from endpoints.services import create_endpoint
from tests.racing import race
from tickets.admission import admit_ticket
from tickets.models import Ticket, Trace

TRACE = "job-7"


def key_of(username: str) -> str:
    get_user_model().objects.create_user(username)
    return create_api_key(username=username)[1]


def post(key: str, body: dict):
    return Client().post(
        "/api/v1/tickets",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def to_trace(key: str, **input_):
    return post(key, {"endpoint": "t.owned", "input": input_, "trace_id": TRACE})


@pytest.fixture
def world():
    create_endpoint(address="t.owned", runner={"kind": "python", "path": "runtime.demo.echo"})
    keys = {"root": key_of("rooty"), "owner": key_of("olive")}
    from endpoints.services import update_endpoint

    update_endpoint(address="t.owned", changes={"owners": ["olive"]})
    return keys


@pytest.mark.django_db
def test_an_owner_reached_by_a_trace_cannot_fill_the_roots_breaker(world, settings):
    settings.TRACE_HARD_LIMIT, settings.TRACE_SOFT_LIMIT = 4, 3
    root = to_trace(world["root"], i=0)
    assert root.status_code == 201 and root.json()["trace_id"] == TRACE
    # The owner sees the root's ticket, so it may add to the trace: up to its
    # own share, then 429, naming the trace it asked for.
    owners = [to_trace(world["owner"], o=i).status_code for i in range(5)]
    assert owners == [201, 201, 201, 201, 429]
    # The root's share is untouched: its own tickets and the runtime's
    # children of them count for it, up to the limit.
    child = admit_ticket(endpoint="t.owned", input={"c": 1}, parent_id=root.json()["id"]).ticket
    assert child.trace_id == TRACE
    assert [to_trace(world["root"], i=i).status_code for i in (1, 2, 3)] == [201, 201, 429]
    # The owner's child counts for the owner, whose share is spent.
    olives = Ticket.objects.filter(trace_id=TRACE, submitted_by__username="olive").first()
    with pytest.raises(CircuitOpen):
        admit_ticket(endpoint="t.owned", input={"c": 2}, parent_id=olives.id)
    trace = Trace.objects.get(id=TRACE)
    assert trace.tickets == 8 and trace.flagged


@pytest.mark.django_db(transaction=True)
def test_racing_parties_each_get_exactly_their_share(world, settings):
    """The owner's flood and the root's own admissions at once: each party
    ends with exactly TRACE_HARD_LIMIT tickets in the trace, whatever the
    interleaving (the trace row is locked while its counts are read)."""
    settings.TRACE_HARD_LIMIT, settings.TRACE_SOFT_LIMIT = 6, 100
    assert to_trace(world["root"], i=0).status_code == 201
    owner = [lambda i=i: to_trace(world["owner"], o=i).status_code for i in range(10)]
    root = [lambda i=i: to_trace(world["root"], i=i).status_code for i in range(1, 8)]
    codes = race(*owner, *root)
    assert sorted(codes[:10]) == [201] * 6 + [429] * 4
    assert sorted(codes[10:]) == [201] * 5 + [429] * 2
    by = Ticket.objects.filter(trace_id=TRACE).values_list("submitted_by__username", flat=True)
    assert sorted(by) == ["olive"] * 6 + ["rooty"] * 6
    assert Trace.objects.get(id=TRACE).tickets == 12
