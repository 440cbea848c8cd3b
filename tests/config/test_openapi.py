"""The OpenAPI document describes every status a route answers, with one
``ErrorOut`` schema, and states the bounds of every ``limit``
(config/openapi.py)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import override_settings

from accounts.keys import create_api_key
from config.openapi import STATUSES
from tickets.admission import admit_ticket

pytestmark = pytest.mark.django_db

# API.md "Errors": every code a client may see.
DOCUMENTED_CODES = {
    "invalid",
    "unauthenticated",
    "forbidden",
    "not_found",
    "dedupe_conflict",
    "stale_turn",
    "invalid_transition",
    "endpoint_busy",
    "stale_generation",
    "second_person_required",
    "too_large",
    "endpoint_quarantined",
    "circuit_open",
    "unavailable",
}
ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}


@pytest.fixture
def schema(client) -> dict:
    resp = client.get("/api/v1/openapi.json")
    assert resp.status_code == 200
    return resp.json()


def operations(schema: dict):
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def test_every_operation_documents_its_error_statuses(schema):
    missing = []
    for method, path, op in operations(schema):
        expected = {"400", "413", "503"}
        if op.get("security"):
            expected.add("401")
        if op.get("parameters") or op.get("requestBody"):
            expected.add("422")
        if "{" in path:
            expected.add("404")
        if method != "GET":
            expected.add("403")
        responses = op["responses"]
        for status in sorted(expected - responses.keys()):
            missing.append(f"{method} {path}: {status}")
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == ERROR_REF, (
                    f"{method} {path} {status} is not an ErrorOut"
                )
                assert response["description"]
        if "503" in responses:
            assert "Retry-After" in responses["503"]["headers"]
    assert not missing, "undocumented error statuses:\n" + "\n".join(missing)


def test_admission_documents_its_own_refusals(schema):
    responses = schema["paths"]["/api/v1/tickets"]["post"]["responses"]
    assert {"409", "423", "429"} <= responses.keys()


def test_retry_documents_its_refusals(schema):
    """A recovering ticket's retry is 409 naming the case; the retry is an
    admission, so a quarantined endpoint (423) and a full trace (429) too."""
    responses = schema["paths"]["/api/v1/tickets/{ticket_id}/retry"]["post"]["responses"]
    assert {"409", "423", "429"} <= responses.keys()
    error = schema["components"]["schemas"]["ErrorOut"]["properties"]["case"]
    assert "retry" in error["description"]


def test_error_out_names_every_documented_code(schema):
    error_out = schema["components"]["schemas"]["ErrorOut"]
    assert set(error_out["required"]) == {"error", "detail"}
    assert set(error_out["properties"]["error"]["enum"]) >= DOCUMENTED_CODES
    assert error_out["additionalProperties"] is True  # codes add fields (ticket, state, ...)
    for status, (codes, _) in STATUSES.items():
        assert set(codes) <= set(error_out["properties"]["error"]["enum"]), status


def test_every_limit_declares_bounds_that_the_route_enforces(schema, api, make_endpoint):
    limits = [
        (method, path, param["schema"])
        for method, path, op in operations(schema)
        for param in op.get("parameters", [])
        if param["name"] == "limit"
    ]
    assert len(limits) >= 2  # /tickets and /recovery/cases
    for method, path, bounds in limits:
        assert bounds.get("minimum") == 1, (path, bounds)
        assert isinstance(bounds.get("maximum"), int), (path, bounds)
        # A route under one endpoint reads the staff caller's own endpoint.
        address = "{address}" in path and make_endpoint().address
        route = path.removeprefix("/api/v1").replace("{address}", address or "")
        assert method == "GET" and "{" not in route
        assert api.get(route, limit=bounds["maximum"]).status_code == 200
        for outside in (0, bounds["maximum"] + 1):
            resp = api.get(route, limit=outside)
            assert resp.status_code == 422 and resp.json()["error"] == "invalid", (route, outside)


# --- What routes answer is what the document says -----------------------------------------


def template_for(schema: dict, method: str, path: str) -> dict:
    """The operation whose path template matches ``path``."""
    for template, ops in schema["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in ops:
            return ops[method.lower()]
    raise AssertionError(f"no operation for {method} {path}")


def test_the_errors_routes_answer_are_documented(schema, client, api, make_endpoint, staff_user):
    """A sample of real refusals across the routes: each status must be one
    the document lists for that operation, in the ErrorOut shape."""
    make_endpoint("alpha")
    done = admit_ticket(endpoint="alpha", input={}).ticket
    api.post(f"/tickets/{done.id}/cancel")
    _, plain_key = create_api_key(username="plain")
    plain = api.as_key(plain_key)
    nobody = api.as_key("cc_nope_nope")
    seen = []

    def check(method: str, path: str, resp) -> None:
        op = template_for(schema, method, f"/api/v1{path}")
        assert str(resp.status_code) in op["responses"], (method, path, resp.status_code)
        body = resp.json()
        assert body["error"] in DOCUMENTED_CODES and body["detail"], body
        seen.append(resp.status_code)

    check("GET", "/tickets", nobody.get("/tickets"))
    check("GET", f"/tickets/{done.id}x", api.get(f"/tickets/{done.id}x"))
    check("POST", f"/tickets/{done.id}/cancel", api.post(f"/tickets/{done.id}/cancel"))
    check("POST", "/endpoints", plain.post("/endpoints", {"address": "x", "runner": {}}))
    check("POST", "/tickets", api.post("/tickets", {"endpoint": "alpha", "input": {"a": "\x00"}}))
    check("POST", "/tickets", api.post("/tickets", {"endpoint": "alpha", "input": {}, "x": 1}))
    check("POST", "/tickets", api.post("/tickets", {"endpoint": "nowhere", "input": {}}))
    check("GET", "/endpoints/al%00pha", api.get("/endpoints/al%00pha"))
    check("GET", "/recovery/cases", api.get("/recovery/cases", limit=0))
    with override_settings(API_MAX_BODY_BYTES=100):
        big = {"endpoint": "alpha", "input": {"a": "x" * 200}}
        check("POST", "/tickets", api.post("/tickets", big))
    first = {"endpoint": "alpha", "input": {}, "dedupe_key": "k"}
    assert api.post("/tickets", first).status_code == 201
    check("POST", "/tickets", api.post("/tickets", {**first, "input": {"b": 1}}))
    assert {400, 401, 403, 404, 409, 413, 422} <= set(seen), seen


def test_the_document_is_served_without_a_key(client):
    resp = client.get("/api/v1/openapi.json")
    assert resp.status_code == 200
    json.dumps(resp.json())  # plain JSON all through


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = schema["components"]["schemas"][name]
    return node


def _described(schema: dict, node: dict, where: str, problems: list[str]) -> None:
    """A body schema is described when it is an object with properties, or
    an array whose items are; anything else (a bare ``object``, no schema)
    is a problem."""
    node = _resolve(schema, node)
    if node.get("type") == "array":
        _described(schema, node.get("items", {}), f"{where}[]", problems)
    elif not node.get("properties"):
        problems.append(f"{where}: {node or 'no schema'}")


def test_every_success_response_has_a_schema_with_properties(schema):
    problems: list[str] = []
    for method, path, op in operations(schema):
        successes = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert successes, f"{method} {path} documents no success status"
        for status, response in successes.items():
            content = response.get("content", {})
            if "text/event-stream" in content:  # a stream: each message described
                body = content["text/event-stream"].get("itemSchema")
            else:
                body = content.get("application/json", {}).get("schema")
            _described(schema, body or {}, f"{method} {path} {status}", problems)
    assert not problems, "responses without a described body:\n" + "\n".join(problems)


def test_the_ticket_schema_names_every_field_of_a_ticket(schema):
    ticket = _resolve(schema, {"$ref": "#/components/schemas/TicketOut"})
    assert {"id", "state", "endpoint", "turn", "delivery", "obligation", "duplicate"} <= set(
        ticket["properties"]
    )
