"""Admission: dedupe, conflicts, aliases, caps, the bad-input table and the
race on one key at real PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from core.errors import DedupeConflict
from tickets.admission import admit_ticket
from tickets.models import LedgerEvent, Ticket

pytestmark = pytest.mark.django_db


def test_new_ticket_is_queued_with_an_admitted_event(api, make_endpoint):
    make_endpoint("alpha")
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"q": 1}, "dedupe_key": "k1"})
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["state"] == "queued"
    assert body["duplicate"] is False
    assert body["endpoint"] == "alpha"
    assert body["dedupe_key"] == "k1"
    assert body["depth"] == 0 and body["parent"] is None
    assert body["obligation"]["state"] == "open"
    events = list(LedgerEvent.objects.filter(ticket_id=body["id"]).values_list("kind", "to_state"))
    assert events == [("admitted", "queued")]


def test_an_admission_answers_what_ticket_out_would_render(api, make_endpoint):
    """The route renders its answer without validating it through TicketOut
    (tickets/api.py ``rendered``): the body must be what that validation
    would have rendered, for a new ticket with every optional part, its
    duplicate and the ticket read back, and carry ninja's content type."""
    from tickets.schemas import TicketOut

    make_endpoint("alpha")
    make_endpoint("beta")
    payload = {
        "endpoint": "alpha",
        "input": {"z": [1, 2.5, None], "a": {"b": "ü"}},
        "dedupe_key": "shape",
        "trace_id": "my-trace",
        "return_to": {"endpoint": "beta", "continuation": {"step": 2}},
        "requester": {"name": "n", "metadata": {"k": "v"}},
    }
    new = api.post("/tickets", payload)
    again = api.post("/tickets", payload)
    assert (new.status_code, again.status_code) == (201, 200), new.content
    read = api.get(f"/tickets/{new.json()['id']}")
    for resp in (new, again):
        body = resp.json()
        assert resp["Content-Type"] == read["Content-Type"]
        assert TicketOut.model_validate(body).model_dump(mode="json") == body
        assert body == {**read.json(), "duplicate": resp is again}


def test_duplicate_key_returns_existing_ticket(api, make_endpoint):
    make_endpoint("alpha")
    first = api.post("/tickets", {"endpoint": "alpha", "input": {"q": 1}, "dedupe_key": "k"})
    again = api.post("/tickets", {"endpoint": "alpha", "input": {"q": 1}, "dedupe_key": "k"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["duplicate"] is True
    assert Ticket.objects.count() == 1


def test_duplicate_is_found_whatever_its_state(api, make_endpoint):
    make_endpoint("alpha")
    first = api.post("/tickets", {"endpoint": "alpha", "input": {}, "dedupe_key": "k"}).json()
    api.post(f"/tickets/{first['id']}/cancel")
    again = api.post("/tickets", {"endpoint": "alpha", "input": {}, "dedupe_key": "k"})
    assert again.status_code == 200
    assert again.json()["state"] == "cancelled" and again.json()["id"] == first["id"]


def test_same_key_different_input_is_a_conflict_naming_the_ticket(api, make_endpoint):
    make_endpoint("alpha")
    first = api.post("/tickets", {"endpoint": "alpha", "input": {"q": 1}, "dedupe_key": "k"})
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"q": 2}, "dedupe_key": "k"})
    assert resp.status_code == 409
    assert resp.json()["error"] == "dedupe_conflict"
    assert resp.json()["ticket"] == first.json()["id"]
    assert Ticket.objects.count() == 1


def test_input_key_order_does_not_make_a_different_input(api, make_endpoint):
    make_endpoint("alpha")
    api.post("/tickets", raw='{"endpoint":"alpha","dedupe_key":"k","input":{"a":1,"b":2}}')
    resp = api.post("/tickets", raw='{"endpoint":"alpha","dedupe_key":"k","input":{"b":2,"a":1}}')
    assert resp.status_code == 200 and resp.json()["duplicate"] is True


def test_alias_converges_on_the_canonical_endpoint(api, make_endpoint):
    make_endpoint("research.weekly-brief", aliases=["weekly-brief", "brief.v1"])
    a = api.post("/tickets", {"endpoint": "weekly-brief", "input": {}, "dedupe_key": "w1"})
    b = api.post("/tickets", {"endpoint": "brief.v1", "input": {}, "dedupe_key": "w1"})
    c = api.post("/tickets", {"endpoint": "research.weekly-brief", "input": {}, "dedupe_key": "w1"})
    assert a.status_code == 201 and b.status_code == 200 and c.status_code == 200
    assert a.json()["id"] == b.json()["id"] == c.json()["id"]
    assert a.json()["endpoint"] == "research.weekly-brief"
    assert api.get("/endpoints/brief.v1").json()["address"] == "research.weekly-brief"


def test_idempotency_key_header_is_the_dedupe_key(api, make_endpoint):
    make_endpoint("alpha")
    first = api.post(
        "/tickets", {"endpoint": "alpha", "input": {}}, headers={"HTTP_IDEMPOTENCY_KEY": "hdr-1"}
    )
    again = api.post("/tickets", {"endpoint": "alpha", "input": {}, "dedupe_key": "hdr-1"})
    assert first.json()["dedupe_key"] == "hdr-1"
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    both = api.post(
        "/tickets",
        {"endpoint": "alpha", "input": {}, "dedupe_key": "other"},
        headers={"HTTP_IDEMPOTENCY_KEY": "hdr-1"},
    )
    assert both.status_code == 400 and both.json()["error"] == "invalid"


def test_without_a_key_every_admission_is_new(api, make_endpoint):
    make_endpoint("alpha")
    a = api.post("/tickets", {"endpoint": "alpha", "input": {}}).json()
    b = api.post("/tickets", {"endpoint": "alpha", "input": {}}).json()
    assert a["id"] != b["id"]


def test_child_ticket_shares_the_trace_and_deepens(api, make_endpoint):
    make_endpoint("alpha")
    root = api.post("/tickets", {"endpoint": "alpha", "input": {}}).json()
    child = api.post("/tickets", {"endpoint": "alpha", "input": {}, "parent": root["id"]}).json()
    assert child["trace_id"] == root["trace_id"] and child["depth"] == 1
    assert child["obligation"]["state"] == "none"
    lineage = api.get(f"/tickets/{child['id']}/lineage").json()
    assert lineage["root"] == root["id"]
    assert {n["id"] for n in lineage["nodes"]} == {root["id"], child["id"]}


BIG = "x" * 70_000

BAD_INPUTS = [
    # (description, raw body or dict, headers, status, code)
    ("malformed JSON", "{bad", None, 400, "invalid"),
    ("body is a list", "[1,2]", None, 422, "invalid"),
    ("missing endpoint", {"input": {}}, None, 422, "invalid"),
    ("missing input", {"endpoint": "alpha"}, None, 422, "invalid"),
    ("input not an object", {"endpoint": "alpha", "input": [1]}, None, 422, "invalid"),
    ("unknown field", {"endpoint": "alpha", "input": {}, "colour": "red"}, None, 422, "invalid"),
    (
        "empty dedupe key",
        {"endpoint": "alpha", "input": {}, "dedupe_key": ""},
        None,
        400,
        "invalid",
    ),
    (
        "dedupe key too long",
        {"endpoint": "alpha", "input": {}, "dedupe_key": "k" * 256},
        None,
        400,
        "invalid",
    ),
    (
        "dedupe key unprintable",
        {"endpoint": "alpha", "input": {}, "dedupe_key": "a\nb"},
        None,
        400,
        "invalid",
    ),
    ("negative wait", {"endpoint": "alpha", "input": {}, "wait_s": -1}, None, 422, "invalid"),
    ("wait too long", {"endpoint": "alpha", "input": {}, "wait_s": 100000}, None, 400, "invalid"),
    (
        "parent not a uuid",
        {"endpoint": "alpha", "input": {}, "parent": "nope"},
        None,
        422,
        "invalid",
    ),
    ("unknown endpoint", {"endpoint": "nowhere", "input": {}}, None, 404, "not_found"),
    (
        "unknown parent",
        {"endpoint": "alpha", "input": {}, "parent": "01930000-0000-7000-8000-000000000000"},
        None,
        404,
        "not_found",
    ),
    (
        "unknown return_to",
        {"endpoint": "alpha", "input": {}, "return_to": {"endpoint": "nowhere"}},
        None,
        404,
        "not_found",
    ),
    ("input over the cap", {"endpoint": "alpha", "input": {"big": BIG}}, None, 413, "too_large"),
    (
        "no key",
        {"endpoint": "alpha", "input": {}},
        {"HTTP_AUTHORIZATION": ""},
        401,
        "unauthenticated",
    ),
    (
        "wrong key",
        {"endpoint": "alpha", "input": {}},
        {"HTTP_AUTHORIZATION": "Bearer cc_000000000000_nope"},
        401,
        "unauthenticated",
    ),
    (
        "webhook to loopback",
        {"endpoint": "alpha", "input": {}, "requester": {"webhook_url": "http://127.0.0.1:9/x"}},
        None,
        400,
        "invalid",
    ),
]


@pytest.mark.parametrize(
    ("why", "body", "headers", "status", "code"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_gets_the_documented_error(api, make_endpoint, why, body, headers, status, code):
    make_endpoint("alpha")
    raw = body if isinstance(body, str) else json.dumps(body)
    resp = api.post("/tickets", raw=raw, headers=headers)
    assert resp.status_code == status, resp.content
    payload = resp.json()
    assert payload["error"] == code
    assert payload["detail"]
    assert Ticket.objects.count() == 0  # nothing half-written


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("get", "/tickets/not-a-uuid", 404, "not_found"),
        ("get", "/tickets/01930000-0000-7000-8000-000000000000", 404, "not_found"),
        ("get", "/tickets?limit=0", 422, "invalid"),  # out of the declared bounds
        ("get", "/tickets?limit=abc", 422, "invalid"),
        ("get", "/tickets?cursor=%%%", 400, "invalid"),
        ("get", "/tickets?state=bogus", 400, "invalid"),
        ("get", "/endpoints/nowhere", 404, "not_found"),
        ("get", "/turns/nope", 404, "not_found"),
        ("get", "/no/such/route", 404, "not_found"),
    ],
)
def test_read_errors_are_json(api, method, path, status, code):
    resp = getattr(api, method)(path)
    assert resp.status_code == status, resp.content
    assert resp.json()["error"] == code


def test_list_is_keyset_paginated_newest_first(api, make_endpoint):
    make_endpoint("alpha")
    ids = [
        api.post("/tickets", {"endpoint": "alpha", "input": {"n": i}}).json()["id"]
        for i in range(5)
    ]
    page1 = api.get("/tickets", limit=2, endpoint="alpha").json()
    assert [t["id"] for t in page1["items"]] == ids[::-1][:2]
    page2 = api.get("/tickets", limit=2, endpoint="alpha", cursor=page1["next_cursor"]).json()
    page3 = api.get("/tickets", limit=2, endpoint="alpha", cursor=page2["next_cursor"]).json()
    assert [t["id"] for t in page2["items"]] == ids[::-1][2:4]
    assert [t["id"] for t in page3["items"]] == ids[::-1][4:]
    assert page3["next_cursor"] is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_admissions_make_one_ticket(make_endpoint):
    """32 threads, one key, real PostgreSQL: the unique constraint decides;
    every caller gets the same id."""
    make_endpoint("race")
    n = 32
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def admit(i: int) -> None:
        try:
            barrier.wait()
            admitted = admit_ticket(endpoint="race", input={"same": True}, dedupe_key="one")
            results[i] = (str(admitted.ticket.id), admitted.duplicate)
        except Exception as exc:  # surfaced by the assertions below
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, tuple) for r in results), results
    assert len({r[0] for r in results}) == 1
    assert sum(1 for r in results if not r[1]) == 1  # exactly one caller created it
    assert Ticket.objects.filter(dedupe_key="one").count() == 1
    assert LedgerEvent.objects.filter(kind="admitted").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_conflicting_admissions_one_wins_others_conflict(make_endpoint):
    make_endpoint("race")
    n = 16
    barrier = threading.Barrier(n)
    outcomes: list = [None] * n

    def admit(i: int) -> None:
        try:
            barrier.wait()
            admit_ticket(endpoint="race", input={"i": i}, dedupe_key="contested")
            outcomes[i] = "created"
        except Exception as exc:
            outcomes[i] = getattr(exc, "code", repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("created") == 1
    assert outcomes.count("dedupe_conflict") == n - 1
    assert Ticket.objects.count() == 1


def test_a_new_ticket_is_one_statement(make_endpoint, django_assert_num_queries):
    make_endpoint("alpha")
    assert connection.vendor == "postgresql"
    with django_assert_num_queries(1):
        admit_ticket(endpoint="alpha", input={"x": 1}, dedupe_key="fast")


def test_a_duplicate_and_a_conflict_cost_one_round_trip(make_endpoint, django_assert_num_queries):
    make_endpoint("alpha")
    first = admit_ticket(endpoint="alpha", input={"x": 1}, dedupe_key="k").ticket
    with django_assert_num_queries(1):
        again = admit_ticket(endpoint="alpha", input={"x": 1}, dedupe_key="k")
    assert again.duplicate and again.ticket.id == first.id
    with django_assert_num_queries(1), pytest.raises(DedupeConflict):
        admit_ticket(endpoint="alpha", input={"x": 2}, dedupe_key="k")


def test_a_duplicate_comes_back_whole_from_the_one_statement(
    make_endpoint, django_assert_num_queries
):
    """The fast path's duplicate branch returns the existing ticket as the ORM
    would load it, with its turn and return_to as far as the payload reads
    them: the answer needs no further query."""
    from tickets import selectors
    from tickets.turns.start import start_turn

    make_endpoint("alpha")
    make_endpoint("beta")
    first = admit_ticket(
        endpoint="alpha",
        input={"x": [1, "two"]},
        dedupe_key="k",
        return_to="beta",
        continuation={"step": 2},
        requester={"name": "r"},
    ).ticket
    assert start_turn(ticket_id=first.id) is not None
    with django_assert_num_queries(1):  # the function's one statement
        again = admit_ticket(endpoint="alpha", input={"x": [1, "two"]}, dedupe_key="k")
        payload = selectors.ticket_payload(again.ticket, duplicate=True)
    assert again.duplicate
    loaded = Ticket.objects.get(id=first.id)
    for field in Ticket._meta.concrete_fields:
        assert getattr(again.ticket, field.attname) == getattr(loaded, field.attname), field.name
    assert payload == selectors.ticket_payload(selectors.get_ticket(first.id), duplicate=True)
    assert payload["turn"]["seq"] == 1 and payload["turn"]["state"] == "running"
    assert payload["return_to"] == {"endpoint": "beta", "continuation": {"step": 2}}
    assert payload["input"] == {"x": [1, "two"]} and payload["requester"] == {"name": "r"}


def test_a_ticket_field_the_duplicate_branch_cannot_convert_fails_at_import():
    """The duplicate branch returns the row as JSON: a field whose JSON form
    is not what the ORM loads (a date, a decimal) must be refused where the
    conversions are built, not reach a caller as a string."""
    import uuid
    from datetime import UTC, datetime

    from django.db import models

    from tickets.admission import _from_json

    assert _from_json(Ticket._meta.get_field("id")) is uuid.UUID
    assert _from_json(Ticket._meta.get_field("turn")) is uuid.UUID  # a key to a UUID
    assert _from_json(Ticket._meta.get_field("endpoint")) is None  # a key to an integer
    instant = _from_json(Ticket._meta.get_field("created_at"))("2026-12-01T15:53:08.5+01:00")
    assert instant == datetime(2026, 12, 1, 14, 53, 8, 500000, tzinfo=UTC)
    assert instant.tzinfo is UTC
    for field in (models.DateField(name="due_on"), models.DecimalField(name="cost")):
        with pytest.raises(TypeError, match="no conversion from to_jsonb"):
            _from_json(field)


def test_a_new_ticket_comes_back_as_the_database_holds_it(make_endpoint, django_assert_num_queries):
    """Admission builds the new ticket from what its function inserted,
    without reading it back: every field must equal the stored row's, and
    the instance must be one the ORM would have loaded (not a new object)."""
    from tickets import selectors

    make_endpoint("alpha")
    with django_assert_num_queries(1):
        admitted = admit_ticket(
            endpoint="alpha", input={"x": [1, "two"]}, dedupe_key="new-k", requester={"name": "r"}
        )
        payload = selectors.ticket_payload(admitted.ticket, duplicate=False)
    assert not admitted.duplicate and not admitted.ticket._state.adding
    loaded = Ticket.objects.get(id=admitted.ticket.id)
    for field in Ticket._meta.concrete_fields:
        assert getattr(admitted.ticket, field.attname) == getattr(loaded, field.attname), field.name
    assert payload == selectors.ticket_payload(selectors.get_ticket(loaded.id), duplicate=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("prepared", [False, True])
def test_admission_is_prepared_only_when_the_setting_says(
    settings, make_endpoint, django_assert_num_queries, prepared
):
    """PgBouncer in transaction mode (1.18) carries no protocol-level
    prepared statement: by default admission is a function call sent as one
    unnamed statement, the function's plans kept by the server session
    itself. With DATABASE_PREPARED_CALLS (a direct connection) the call is
    prepared once per session."""
    settings.DATABASE_PREPARED_CALLS = prepared
    connection.close()  # a server session of this test's own
    make_endpoint("alpha")
    with django_assert_num_queries(1) as captured:
        first = admit_ticket(endpoint="alpha", input={"x": 1}, dedupe_key="p1")
    assert "claimcheck_admit_v2(" in captured.captured_queries[0]["sql"]
    second = admit_ticket(endpoint="alpha", input={"x": 2}, dedupe_key="p2")
    again = admit_ticket(endpoint="alpha", input={"x": 1}, dedupe_key="p1")
    assert not first.duplicate and not second.duplicate and again.duplicate
    assert again.ticket.id == first.ticket.id
    assert Ticket.objects.filter(endpoint__address="alpha").count() == 2
    assert LedgerEvent.objects.filter(kind="admitted").count() == 2
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        kept = [row[0] for row in cur.fetchall()]
    # Three calls, one statement planned for them all (or none).
    assert [s.startswith("SELECT * FROM claimcheck_admit_v2(") for s in kept] == (
        [True] if prepared else []
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("delete", "/api/v1/tickets"),
        ("put", "/api/v1/endpoints/alpha"),
        ("get", "/api/v1/tickets/01930000-0000-7000-8000-000000000000/cancel"),
    ],
)
def test_a_method_the_route_does_not_take_is_a_json_405(client, api_key, method, path):
    resp = getattr(client, method)(path, HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert resp.status_code == 405
    assert resp.json()["error"] == "method_not_allowed"
    assert resp.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_an_admission_on_a_connection_a_database_restart_broke_reconnects(api, make_endpoint):
    """A web thread's kept connection that a PostgreSQL restart severed is
    replaced before the admission uses it (CONN_HEALTH_CHECKS), as Django's
    own cursors do: the first request after the restart is 201, not a 503.
    The fault suite found it: the prepared admission statement went to the
    raw connection, past the health check."""
    import psycopg

    make_endpoint("alpha")
    first = api.post("/tickets", {"endpoint": "alpha", "input": {"n": 1}})
    assert first.status_code == 201, first.content
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.update(user="postgres", dbname=params.get("dbname"))
    params.pop("password", None)
    with psycopg.connect(**params, autocommit=True) as admin:  # what a restart does
        # Returning once the backend has exited, as a restart is over before
        # the next request (the health check reads what it left on the socket).
        assert admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]
    # What the request_started signal does under a real server (Django's test
    # client disconnects it): it arms the health check for the next query.
    connection.close_if_unusable_or_obsolete()
    after = api.post("/tickets", {"endpoint": "alpha", "input": {"n": 2}})
    assert after.status_code == 201, after.content
    assert connection.connection.info.backend_pid != pid
    assert Ticket.objects.filter(endpoint__address="alpha").count() == 2
