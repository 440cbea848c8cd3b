"""The OpenAPI document names every error status each route can answer, with
one ``ErrorOut`` schema, added once here so routes need not repeat them.

ninja documents only the success statuses a route declares. ``document_errors``
adds, to every operation:

- the statuses any route can answer: 400 (unstorable text in the path,
  query or headers: core/middleware.py), 413 (a body over
  ``API_MAX_BODY_BYTES``) and 503 (the database or broker briefly away);
  401 when the route takes a key; 422 when it takes parameters or a body;
  404 when its path names an object; 403 when it changes something;
- what ``ROUTE_ERRORS`` adds for a route (409 on state changes, 423 and 429
  on admission, ...). A route missing from the table gets 403, 404 and 409
  too, so a new route is over-documented rather than under.
"""

from __future__ import annotations

from typing import Any, Literal

from ninja import NinjaAPI, Schema
from pydantic import ConfigDict, Field

# API.md "Errors": status -> (codes, when). 405 and 500 are the shapes the
# error middleware gives Django's own answers; no route answers 500 to bad
# input, and 405 is a method the path does not have (not an operation).
STATUSES: dict[int, tuple[tuple[str, ...], str]] = {
    400: (
        ("invalid", "invalid_search"),
        "Malformed body or parameters (`detail` says what); text the ledger cannot store "
        "(a NUL, a lone surrogate, a non-finite number) names the place in `field`. "
        "`invalid_search`: a `search` term that does not parse (`field` is `search`).",
    ),
    401: (("unauthenticated",), "No valid `Authorization: Bearer <key>`."),
    403: (
        ("forbidden", "second_person_required"),
        "The caller may see this but not do it (not an owner, not staff); "
        "`second_person_required`: a proposer approving their own endpoint change.",
    ),
    404: (("not_found",), "Unknown (or not visible) ticket, endpoint, turn or case."),
    409: (
        (
            "dedupe_conflict",
            "stale_turn",
            "invalid_transition",
            "endpoint_busy",
            "endpoint_paused",
            "stale_generation",
        ),
        "Conflicts with the current state: `dedupe_conflict` (body has `ticket`), "
        "`stale_turn`, `invalid_transition` (body has `state`), `endpoint_busy`, "
        "`endpoint_paused` (a paused `reject` endpoint), "
        "`stale_generation` (body has `generation` and `since`).",
    ),
    413: (
        ("too_large",),
        "The body is over `API_MAX_BODY_BYTES`, or an input or result is over its cap.",
    ),
    422: (("invalid",), "The body or a parameter does not match the schema; `errors` lists each."),
    423: (("endpoint_quarantined",), "The endpoint is quarantined; body has `case`."),
    429: (
        ("circuit_open", "trace_budget_exhausted", "rate_limited"),
        "`circuit_open`: the caller's party reached `TRACE_HARD_LIMIT` in the trace; "
        "`trace_budget_exhausted`: the trace spent its token, cost or time budget; "
        "`rate_limited`: the caller is over one of its fair-share limits (admissions per "
        "window, requests in flight): retry after `Retry-After` seconds.",
    ),
    503: (
        ("unavailable",),
        "The database or broker is briefly unreachable; retry after `Retry-After` seconds.",
    ),
}
OTHER_CODES = ("method_not_allowed", "internal")
ERROR_CODES = tuple(dict.fromkeys(c for codes, _ in STATUSES.values() for c in codes)) + OTHER_CODES

ErrorCode = Literal[ERROR_CODES]  # type: ignore[valid-type]


class ValidationProblem(Schema):
    loc: list[str]
    msg: str | None = None


class ErrorOut(Schema):
    """Every error: ``{"error": code, "detail": sentence, ...}``; some codes
    add fields (listed here), and none is ever removed."""

    model_config = ConfigDict(extra="allow", title="ErrorOut")

    error: ErrorCode
    detail: str = Field(description="A sentence for a person.")
    field: str | None = Field(
        default=None, description="400: where unstorable text was (e.g. `input.a.b`, `path`)."
    )
    errors: list[ValidationProblem] | None = Field(default=None, description="422: each problem.")
    ticket: str | None = Field(default=None, description="409 dedupe_conflict: the ticket.")
    state: str | None = Field(default=None, description="409 invalid_transition: its state.")
    case: str | None = Field(
        default=None,
        description="423: the open recovery case; 409 on a retry of a `recovering` ticket: "
        "the case an owner decides instead.",
    )
    limit: int | None = Field(
        default=None, description="413: the limit in bytes; 429 rate_limited: the limit."
    )
    retry_after: int | None = Field(
        default=None, description="429 rate_limited, 503: seconds before a retry."
    )


# Statuses a route adds to the defaults, by "METHOD /path" under the API root.
ROUTE_ERRORS: dict[str, set[int]] = {
    "POST /endpoints": {404},  # an unknown owner
    "GET /endpoints": set(),
    "GET /endpoints/{address}": set(),
    "PATCH /endpoints/{address}": {409},  # stale_generation
    "POST /endpoints/{address}/pause": set(),
    "POST /endpoints/{address}/resume": set(),
    "POST /workers/{name}/consuming": set(),
    "POST /tickets": {404, 409, 423, 429},
    "GET /tickets": {404},  # an unknown endpoint filter
    "GET /tickets/{ticket_id}": set(),
    "GET /tickets/{ticket_id}/events": set(),
    "GET /tickets/{ticket_id}/stream": {429},
    "GET /tickets/{ticket_id}/lineage": set(),
    "POST /tickets/{ticket_id}/cancel": {409},
    # Both admit a ticket: admission's refusals (a quarantined endpoint, a
    # busy or paused "reject" one, a full trace); a retry's 409 also names
    # the case of a recovering ticket.
    "POST /tickets/{ticket_id}/retry": {409, 423, 429},
    "POST /endpoints/{address}/approvals/{ticket_id}/{call_id}": {409, 423, 429},
    "POST /tickets/{ticket_id}/approve": {409},
    "POST /tickets/{ticket_id}/delivery/ack": {409},
    "POST /tickets/{ticket_id}/obligation": {409},
    "POST /tickets/{ticket_id}/obligation/close": {409},
    "GET /turns/{turn_id}": {403},
    "POST /turns/{turn_id}/heartbeat": {409},
    "POST /turns/{turn_id}/result": {409},
    "POST /turns/{turn_id}/stopped": {409},
    "POST /schedules": {404},  # an unknown endpoint
    "GET /schedules": {404},  # an unknown endpoint filter
    "GET /schedules/{schedule_id}": set(),
    "POST /schedules/{schedule_id}/pause": set(),
    "POST /schedules/{schedule_id}/resume": set(),
    "DELETE /schedules/{schedule_id}": set(),
    "GET /recovery/cases": set(),
    "GET /recovery/cases/{case_id}": {403},
    "POST /recovery/cases/{case_id}/inspections": {409},
    "POST /recovery/cases/{case_id}/decisions": {409},
    "POST /recovery/cases/{case_id}/lesson": {409},
}
UNLISTED_ERRORS = {403, 404, 409}
# The IETF draft's RateLimit fields on a `rate_limited` answer (core/errors.py).
RATE_LIMIT_HEADERS = {
    "RateLimit-Limit": "the limit the caller is over.",
    "RateLimit-Remaining": "what is left of it (0).",
    "RateLimit-Reset": "seconds until the window frees up.",
}
WRITE_METHODS = {"post", "put", "patch", "delete"}


def error_statuses(method: str, path: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses of one operation (see the module docstring)."""
    statuses = {400, 413, 503}
    if operation.get("security"):
        statuses.add(401)
        # A key's requests in flight are limited on every route (core/fairshare.py).
        statuses.add(429)
    if operation.get("parameters") or operation.get("requestBody"):
        statuses.add(422)
    if "{" in path:
        statuses.add(404)
    if method in WRITE_METHODS:
        statuses.add(403)
    return statuses | ROUTE_ERRORS.get(f"{method.upper()} {path}", UNLISTED_ERRORS)


def _response(status: int) -> dict[str, Any]:
    codes, when = STATUSES[status]
    response: dict[str, Any] = {
        "description": f"{' | '.join(codes)}: {when}",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
    }
    if status in (429, 503):
        response["headers"] = {
            "Retry-After": {
                "description": "Seconds to wait before retrying.",
                "schema": {"type": "integer", "minimum": 0},
            }
        }
    if status == 429:
        for name, what in RATE_LIMIT_HEADERS.items():
            response["headers"][name] = {
                "description": f"`rate_limited` only: {what}",
                "schema": {"type": "integer", "minimum": 0},
            }
    return response


def document_errors(schema: dict[str, Any], *, root: str) -> dict[str, Any]:
    """Add ``ErrorOut`` and every operation's error responses to ``schema``
    (ninja's generated document, paths under ``root`` such as ``/api/v1/``)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(error_schema.pop("$defs", {}))
    components["ErrorOut"] = error_schema
    prefix = "/" + root.strip("/")
    for full_path, operations in schema.get("paths", {}).items():
        path = full_path[len(prefix) :] if full_path.startswith(prefix + "/") else full_path
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status in sorted(error_statuses(method, path, operation)):
                if status not in responses and str(status) not in responses:
                    responses[status] = _response(status)
    return schema


class DocumentedErrorsAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI document lists every route's error statuses."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        return document_errors(schema, root=path_prefix)
