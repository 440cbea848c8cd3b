"""Input PostgreSQL cannot store, oversized bodies, bodies that are not JSON
and loosely typed numbers: each is a clear 400/413/422 in the documented
shape, naming the field, and nothing is written (core/inputs.py, the
parser in config/api.py and InputGuardMiddleware in core/middleware.py)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import override_settings

from endpoints.models import Endpoint
from tickets.admission import admit_ticket
from tickets.models import LedgerEvent, Ticket

pytestmark = pytest.mark.django_db


def ticket_body(**fields) -> dict:
    return {"endpoint": "alpha", "input": {"q": 1}, **fields}


def raw_ticket(input_text: str, **fields) -> str:
    """A body whose ``input`` is written as raw JSON text (json.dumps cannot
    write NaN-free non-finite numbers such as 1e400 literally)."""
    head = json.dumps({"endpoint": "alpha", **fields})[:-1]
    return f'{head}, "input": {input_text}}}'


# (case, route, body: dict serialised with json.dumps (which writes "\u0000" and
# "\udc00" as JSON escapes) or raw text, field named in the answer)
BAD_BODIES = [
    (
        "NUL in an input value",
        "/tickets",
        {**ticket_body(input={"a": {"b": "x\x00y"}})},
        "input.a.b",
    ),
    ("NUL in an input key", "/tickets", ticket_body(input={"a": {"k\x00": 1}}), "input.a.k\\u0000"),
    ("NUL in a list item", "/tickets", ticket_body(input={"a": ["ok", "\x00"]}), "input.a.1"),
    ("lone surrogate in a value", "/tickets", ticket_body(input={"a": "\udc00"}), "input.a"),
    ("lone surrogate in a key", "/tickets", ticket_body(input={"\ud800x": 1}), "input.\\ud800x"),
    ("1e400 in input", "/tickets", raw_ticket('{"a": {"b": 1e400}}'), "input.a.b"),
    ("-1e400 in input", "/tickets", raw_ticket('{"a": [1, -1e400]}'), "input.a.1"),
    ("NaN in input", "/tickets", raw_ticket('{"a": NaN}'), "input.a"),
    ("Infinity in input", "/tickets", raw_ticket('{"a": Infinity}'), "input.a"),
    ("-Infinity in input", "/tickets", raw_ticket('{"a": -Infinity}'), "input.a"),
    (
        "NUL in requester.name",
        "/tickets",
        ticket_body(requester={"name": "a\x00"}),
        "requester.name",
    ),
    (
        "surrogate in requester.metadata",
        "/tickets",
        ticket_body(requester={"metadata": {"k": "\udfff"}}),
        "requester.metadata.k",
    ),
    ("NUL in endpoint", "/tickets", ticket_body(endpoint="al\x00pha"), "endpoint"),
    ("NUL in trace_id", "/tickets", ticket_body(trace_id="t\x00"), "trace_id"),
    ("NUL in dedupe_key", "/tickets", ticket_body(dedupe_key="k\x00"), "dedupe_key"),
    (
        "NUL in a continuation",
        "/tickets",
        ticket_body(return_to={"endpoint": "alpha", "continuation": {"x": "\x00"}}),
        "return_to.continuation.x",
    ),
    (
        "Infinity as wait_s",
        "/tickets",
        raw_ticket("{}", wait_s="@").replace('"@"', "Infinity"),
        "wait_s",
    ),
    (
        "NUL in a runner",
        "/endpoints",
        {"address": "beta", "runner": {"kind": "python", "path": "a\x00"}},
        "runner.path",
    ),
    (
        "NUL in a decision's rationale",
        f"/recovery/cases/{uuid.uuid4()}/decisions",
        {"action": "release", "rationale": "\x00"},
        "rationale",
    ),
]


def counts() -> tuple[int, int, int]:
    return Ticket.objects.count(), LedgerEvent.objects.count(), Endpoint.objects.count()


def assert_refused(resp, field: str, status: int = 400) -> dict:
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert body["error"] == "invalid", body
    assert body["field"] == field, body
    assert field in body["detail"], body
    return body


@pytest.mark.parametrize(
    ("route", "body", "field"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
def test_unstorable_text_in_a_body_is_400_naming_the_field(api, make_endpoint, route, body, field):
    make_endpoint("alpha")
    before = counts()
    resp = api.post(route, raw=body if isinstance(body, str) else json.dumps(body))
    assert_refused(resp, field)
    assert counts() == before


def test_unstorable_text_in_a_patch_body_is_400(api, make_endpoint):
    make_endpoint("alpha")
    resp = api.patch("/endpoints/alpha", {"runner": {"kind": "python", "path": "x\x00"}})
    assert_refused(resp, "runner.path")
    assert Endpoint.objects.get(address="alpha").runner["path"] == "runtime.demo.echo"


def test_nul_in_the_idempotency_key_header_is_400(api, make_endpoint):
    make_endpoint("alpha")
    resp = api.post("/tickets", ticket_body(), headers={"HTTP_IDEMPOTENCY_KEY": "k\x00"})
    assert_refused(resp, "headers.Idempotency-Key")
    assert Ticket.objects.count() == 0


def test_nul_in_the_authorization_header_is_400_not_500(api, client):
    resp = client.get("/api/v1/tickets", HTTP_AUTHORIZATION="Bearer cc_\x00_secret")
    assert_refused(resp, "headers.Authorization")


@pytest.mark.parametrize(
    "path",
    [
        "/endpoints/al%00pha",
        "/tickets/%00",
        "/tickets/%00/events",
        "/recovery/cases/%00",
    ],
)
def test_nul_in_a_path_parameter_is_400(api, make_endpoint, path):
    make_endpoint("alpha")
    assert_refused(api.get(path), "path")


def test_nul_in_a_path_parameter_of_a_post_writes_nothing(api, make_endpoint):
    make_endpoint("alpha")
    before = counts()
    assert_refused(api.post("/tickets/%00/cancel"), "path")
    assert_refused(api.patch("/endpoints/al%00pha", {"turn_budget_s": 5}), "path")
    assert counts() == before


@pytest.mark.parametrize(
    ("route", "params", "field"),
    [
        ("/tickets", {"endpoint": "al\x00pha"}, "query.endpoint"),
        ("/tickets", {"trace_id": "\x00"}, "query.trace_id"),
        ("/tickets", {"state": "queued\x00"}, "query.state"),
        ("/tickets", {"cursor": "\x00"}, "query.cursor"),
        ("/tickets", {"a\x00": "1"}, "query.a\\u0000"),
        ("/recovery/cases", {"state": "\x00"}, "query.state"),
    ],
)
def test_nul_in_a_query_parameter_is_400(api, make_endpoint, route, params, field):
    make_endpoint("alpha")
    assert_refused(api.get(route, **params), field)


def test_storable_unicode_and_numbers_are_kept_exactly(api, make_endpoint):
    """The check refuses only what PostgreSQL cannot store: other control
    characters, astral characters, huge integers and large finite floats
    are kept."""
    make_endpoint("alpha")
    value = {"ctl": "\x01\x1f", "emoji": "\U0001f600 é", "big": 10**40, "f": 12.5, "neg": -0.5}
    resp = api.post("/tickets", {"endpoint": "alpha", "input": value})
    assert resp.status_code == 201, resp.content
    assert api.get(f"/tickets/{resp.json()['id']}").json()["input"] == value
    # The largest finite doubles are numbers too (PostgreSQL prints them back
    # without an exponent, so only their admission is checked here).
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"f": 1e308, "g": -1.7e308}})
    assert resp.status_code == 201, resp.content


# --- Size, media type, malformed JSON -----------------------------------------------------


def test_a_10_mb_body_is_413_too_large(api, make_endpoint):
    make_endpoint("alpha")
    blob = "x" * (10 * 1024 * 1024)
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"blob": blob}})
    assert resp.status_code == 413, resp.content[:300]
    body = resp.json()
    assert body["error"] == "too_large"
    assert "API_MAX_BODY_BYTES" in body["detail"] and "artifact" in body["detail"]
    assert Ticket.objects.count() == 0


@override_settings(API_MAX_BODY_BYTES=2000)
def test_the_body_limit_is_a_setting(api, make_endpoint):
    make_endpoint("alpha")
    small = api.post("/tickets", {"endpoint": "alpha", "input": {"blob": "x" * 1500}})
    assert small.status_code == 201, small.content
    big = api.post("/tickets", {"endpoint": "alpha", "input": {"blob": "x" * 2500}})
    assert big.status_code == 413 and big.json()["error"] == "too_large"
    assert "2000" in big.json()["detail"]


@override_settings(API_MAX_BODY_BYTES=10**9, DATA_UPLOAD_MAX_MEMORY_SIZE=2000)
def test_djangos_own_body_cap_is_413_too(api, make_endpoint):
    """Should Django's DATA_UPLOAD_MAX_MEMORY_SIZE be the lower (settings keep
    it at least API_MAX_BODY_BYTES), its refusal is still 413 too_large."""
    make_endpoint("alpha")
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"blob": "x" * 2500}})
    assert resp.status_code == 413 and resp.json()["error"] == "too_large"
    assert Ticket.objects.count() == 0


def test_a_ticket_input_over_its_cap_is_still_413_from_admission(api, make_endpoint, settings):
    """Under the body limit but over TICKET_MAX_INPUT_BYTES: the ledger's own cap."""
    make_endpoint("alpha")
    blob = "x" * (settings.TICKET_MAX_INPUT_BYTES + 10)
    resp = api.post("/tickets", {"endpoint": "alpha", "input": {"blob": blob}})
    assert resp.status_code == 413 and resp.json()["error"] == "too_large"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_400(client, api, make_endpoint, content_type):
    make_endpoint("alpha")
    resp = client.post(
        "/api/v1/tickets",
        json.dumps(ticket_body()),
        content_type=content_type,
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
    )
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["error"] == "invalid" and "application/json" in body["detail"]
    assert content_type in body["detail"]
    assert Ticket.objects.count() == 0


def test_json_with_a_charset_or_a_json_suffix_is_accepted(client, api, make_endpoint):
    make_endpoint("alpha")
    for n, content_type in enumerate(
        ["application/json; charset=utf-8", "application/vnd.claimcheck+json"]
    ):
        resp = client.post(
            "/api/v1/tickets",
            json.dumps(ticket_body(dedupe_key=f"k{n}")),
            content_type=content_type,
            HTTP_AUTHORIZATION=f"Bearer {api.key}",
        )
        assert resp.status_code == 201, resp.content


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"endpoint": "alpha", "input": {', "not valid JSON"),
        ('{"endpoint": "alpha", "input": {}}}', "not valid JSON"),
        (b'{"endpoint": "alpha", "input": {"a": "\xff"}}', "UTF-8"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
    ],
    ids=["truncated", "trailing", "not utf-8", "deep"],
)
def test_malformed_json_is_400_saying_what_is_wrong(client, api, make_endpoint, raw, says):
    make_endpoint("alpha")
    resp = client.post(
        "/api/v1/tickets",
        raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
    )
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"] == "invalid" and says in resp.json()["detail"]


# --- Strict numbers ---------------------------------------------------------------------------


def test_wait_s_as_a_string_is_422(api, make_endpoint):
    make_endpoint("alpha")
    resp = api.post("/tickets", ticket_body(wait_s="5"))
    assert resp.status_code == 422, resp.content
    body = resp.json()
    assert body["error"] == "invalid" and "wait_s" in body["detail"]
    assert body["errors"][0]["loc"][-1] == "wait_s"
    assert Ticket.objects.count() == 0
    # A JSON number, integer or not, is still a number.
    assert api.post("/tickets", ticket_body(wait_s=0, dedupe_key="a")).status_code == 201
    assert api.post("/tickets", ticket_body(wait_s=0.0, dedupe_key="b")).status_code == 201


@pytest.mark.parametrize(
    "change",
    [
        {"turn_budget_s": "5"},
        {"interrupt_grace_s": "2"},
        {"heartbeat_timeout_s": "30"},
        {"requires_approval": "true"},
        {"requires_approval": 1},
    ],
)
def test_endpoint_numbers_and_flags_are_strictly_typed(api, make_endpoint, change):
    make_endpoint("alpha")
    resp = api.patch("/endpoints/alpha", change)
    assert resp.status_code == 422, resp.content
    assert resp.json()["error"] == "invalid" and next(iter(change)) in resp.json()["detail"]


@pytest.mark.parametrize(
    ("route", "limit"),
    [("/tickets", 0), ("/tickets", 201), ("/recovery/cases", 0), ("/recovery/cases", 501)],
)
def test_a_limit_out_of_bounds_is_422(api, route, limit):
    resp = api.get(route, limit=limit)
    assert resp.status_code == 422, resp.content
    assert resp.json()["error"] == "invalid" and "limit" in resp.json()["detail"]


# --- The console ------------------------------------------------------------------------------


@pytest.fixture
def owner_client(client, staff_user, make_endpoint):
    client.force_login(staff_user)
    return client


def test_nul_in_a_console_filter_is_400_not_500(owner_client, make_endpoint):
    make_endpoint("alpha")
    resp = owner_client.get("/tickets/", {"endpoint": "al\x00pha"})
    assert resp.status_code == 400
    assert b"endpoint" in resp.content and b"NUL" in resp.content


def test_nul_in_a_console_form_field_is_400_and_writes_nothing(owner_client, make_endpoint):
    endpoint = make_endpoint("alpha")
    ticket = admit_ticket(endpoint=endpoint.address, input={}).ticket
    events = LedgerEvent.objects.filter(ticket=ticket).count()
    resp = owner_client.post(f"/tickets/{ticket.id}/obligation/", {"note": "late\x00"})
    assert resp.status_code == 400
    assert b"note" in resp.content
    assert LedgerEvent.objects.filter(ticket=ticket).count() == events


def test_nul_in_a_console_path_is_400(owner_client):
    assert owner_client.get("/endpoints/al%00pha/").status_code == 400
    assert owner_client.get("/traces/t%00/").status_code == 400


def test_a_surrogate_written_as_raw_utf8_bytes_is_400(client, api, make_endpoint):
    """json.loads decodes bytes with 'surrogatepass': ED B0 80 becomes U+DC00
    without any escape in the text, so the check cannot look for escapes."""
    make_endpoint("alpha")
    raw = b'{"endpoint": "alpha", "input": {"a": "x\xed\xb0\x80"}}'
    resp = client.post(
        "/api/v1/tickets",
        raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
    )
    assert_refused(resp, "input.a")
    assert Ticket.objects.count() == 0


# --- The parser on its own --------------------------------------------------------------------


def test_the_walk_names_deep_places_without_recursing():
    from core.inputs import Unstorable, loads

    deep = '{"a": ' * 500 + '"\\u0000"' + "}" * 500
    with pytest.raises(Unstorable) as info:
        loads(deep)
    assert info.value.extra["field"] == ".".join(["a"] * 500)
    with pytest.raises(Unstorable) as info:
        loads('"\\u0000"')
    assert info.value.extra["field"] == "body"
    with pytest.raises(Unstorable) as info:
        loads('[{"ok": [1, 2.5, true, null]}, {"x": [NaN]}]')
    assert info.value.extra["field"] == "1.x.0"
    assert loads('{"a": [1, 2.5, "\\u00e9\\ud83d\\ude00", {"b": null}]}') == {
        "a": [1, 2.5, "é😀", {"b": None}]
    }


# --- The depth bound --------------------------------------------------------------------------


def nest(depth: int) -> dict:
    value: dict | int = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (ticket_body(input=nest(65)), "input"),
        (ticket_body(input=nest(800)), "input"),
        (ticket_body(requester={"metadata": nest(64)}), "requester"),
        (ticket_body(return_to={"endpoint": "alpha", "continuation": nest(64)}), "return_to"),
    ],
    ids=["input 65", "input 800", "requester", "return_to"],
)
def test_a_field_nested_past_the_bound_is_400_naming_it(api, make_endpoint, body, field):
    make_endpoint("alpha")
    before = counts()
    body = assert_refused(api.post("/tickets", body), field)
    assert "nested more than 64 levels deep" in body["detail"]
    assert counts() == before


def test_a_turn_result_nested_past_the_bound_is_400_and_the_turn_runs_on(api, make_endpoint):
    from runtime import turns as runtime

    make_endpoint("alpha")
    started = runtime.start_turn(ticket_id=admit_ticket(endpoint="alpha", input={}).ticket.id)
    path = f"/turns/{started.turn.id}/result"
    turn_api = api.as_key(started.token)
    for body, field in [
        ({"seq": started.turn.seq, "result": nest(65)}, "result"),
        ({"seq": started.turn.seq, "error": {"detail": nest(64)}}, "error"),
    ]:
        assert_refused(turn_api.post(path, body), field)
    assert Ticket.objects.get(id=started.ticket.id).state == "running"
    answer = turn_api.post(path, {"seq": started.turn.seq, "result": nest(64)})
    assert answer.status_code == 200, answer.content
    assert Ticket.objects.get(id=started.ticket.id).result == nest(64)


def test_the_bound_is_a_setting(api, make_endpoint, settings):
    make_endpoint("alpha")
    settings.TICKET_MAX_JSON_DEPTH = 3
    assert api.post("/tickets", ticket_body(input=nest(3))).status_code == 201
    assert_refused(api.post("/tickets", ticket_body(input=nest(4))), "input")


# What the runtime nests around a value it carries, at most: a history row in
# an envelope ({"history": [{"input": value}]}: 3 levels); a wait's child in
# ``asdict`` of an outcome (wait, children, the list, the child: 4); the
# pipe's message to a turn's process (a tuple, the fields: 2).
RUNTIME_WRAPPING = 4
# The stack a turn runs on in a Celery worker is shallower than under pytest
# (tests/endpoints/deep_runners.frames measures the latter); the margin is
# taken with this many frames more than that, for what a deployment adds.
STACK_ALLOWANCE = 100


def _first_failing_depth(fn, frames: int) -> int:
    """The least nesting at which ``fn`` raises RecursionError when called
    ``frames`` frames deep."""

    def at(depth_left: int, value):
        return fn(value) if depth_left <= 0 else at(depth_left - 1, value)

    low, high = 1, 3000
    while low < high:
        mid = (low + high) // 2
        try:
            at(frames - len(__import__("inspect").stack(0)), nest(mid))
            low = mid + 1
        except RecursionError:
            high = mid
    return low


def test_the_bound_is_far_below_what_the_worker_can_carry(make_endpoint, settings):
    """A value at the bound, wrapped as the runtime wraps it, round-trips
    through pickle (a turn's process), json and dataclasses.asdict (the
    finish) and PostgreSQL; each of those fails only at a depth at least
    four times that, measured on a stack deeper than a turn's."""
    import dataclasses
    import pickle

    from django.db import connection

    from runtime import turns as runtime
    from runtime.runners import Child, Outcome, Wait

    carried = nest(settings.TICKET_MAX_JSON_DEPTH + RUNTIME_WRAPPING)

    def as_outcome(value):
        return dataclasses.asdict(Outcome("wait", wait=Wait(children=[Child("x", value)])))

    assert pickle.loads(pickle.dumps(carried)) == carried
    assert json.loads(json.dumps(carried)) == carried
    assert as_outcome(carried)["wait"]["children"][0]["input"] == carried
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb", [json.dumps(carried)])
        assert json.loads(cursor.fetchone()[0]) == carried

    make_endpoint("frames", path="tests.endpoints.deep_runners.frames", isolation="inline")
    ticket = admit_ticket(endpoint="frames", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    frames = Ticket.objects.get(id=ticket.id).result["frames"] + STACK_ALLOWANCE
    depth = settings.TICKET_MAX_JSON_DEPTH + RUNTIME_WRAPPING
    failing = {
        "pickle": _first_failing_depth(pickle.dumps, frames),
        "json": _first_failing_depth(json.dumps, frames),
        "asdict": _first_failing_depth(as_outcome, frames),
    }
    print(f"runner stack {frames - STACK_ALLOWANCE} frames; first failing depth {failing}")
    assert all(found >= 4 * depth for found in failing.values()), (frames, failing)
