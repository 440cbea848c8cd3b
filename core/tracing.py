"""W3C Trace Context (``traceparent``) in and out.

- Admission (``POST /api/v1/tickets``): a valid ``traceparent`` header's
  trace id becomes the ticket's ``trace_id`` when the body gives none (and
  the ticket has no parent, whose trace it inherits). A malformed header is
  ignored.
- The ticket's trace travels with the ticket: the turn envelope carries
  ``trace: {trace_id, traceparent}``, the ``http`` runner sends
  ``traceparent`` with its POST, every webhook delivery sends it, and API
  responses return it.

A ticket's ``trace_id`` is any 1-64 printable characters (the API allows a
caller's own ids). Its W3C form is the id itself when it is 32 lower-case hex
digits and not all zero (every default trace id, and every one taken from a
``traceparent``, is); otherwise the first 32 hex digits of its SHA-256, so
one ledger trace is always one W3C trace.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from core import logs

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class TraceParent:
    trace_id: str
    parent_id: str
    flags: str


def parse_traceparent(value: str) -> TraceParent | None:
    """A valid version-00 (or later, read as 00) header, else None."""
    match = _TRACEPARENT.match((value or "").strip().lower())
    if not match:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(trace_id=trace_id, parent_id=parent_id, flags=flags)


def w3c_trace_id(trace_id: str) -> str:
    """The 32-hex W3C trace id of a ledger ``trace_id`` (module docstring)."""
    if _HEX32.match(trace_id) and trace_id != "0" * 32:
        return trace_id
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


def new_span_id() -> str:
    while True:
        span = secrets.token_hex(8)
        if span != "0" * 16:
            return span


def traceparent_for(trace_id: str, *, flags: str = "01") -> str:
    """A ``traceparent`` for a ledger trace, with a fresh span id (ours)."""
    return f"00-{w3c_trace_id(trace_id)}-{new_span_id()}-{flags}"


def admission_trace_id(request, *, parent: uuid.UUID | None, given: str | None) -> str | None:
    """The trace id admission should record: the body's, else (for a root
    ticket) the trace id of the request's valid ``traceparent``, else None
    (admission then starts a new trace)."""
    if given is not None or parent is not None:
        return given
    incoming = getattr(request, "claimcheck_traceparent", None)
    return incoming.trace_id if incoming is not None else None


def incoming_traceparent(request) -> str | None:
    """The request's valid ``traceparent``, normalised (version 00), or None."""
    incoming = getattr(request, "claimcheck_traceparent", None)
    if incoming is None:
        return None
    return f"00-{incoming.trace_id}-{incoming.parent_id}-{incoming.flags}"


def current_trace_id() -> str | None:
    return logs.current().get("trace_id")


def envelope_trace() -> dict[str, str] | None:
    """The turn envelope's ``trace`` member, for the turn being run."""
    trace_id = current_trace_id()
    if not trace_id:
        return None
    return {"trace_id": trace_id, "traceparent": traceparent_for(trace_id)}


def outgoing_headers(trace_id: str | None = None) -> dict[str, str]:
    """``traceparent`` for a request we send (the http runner, a webhook)."""
    trace_id = trace_id or current_trace_id()
    return {"traceparent": traceparent_for(trace_id)} if trace_id else {}


def delivery_headers(ticket) -> dict[str, str]:
    """A webhook attempt's ``traceparent``; also binds the ticket's ids for
    the attempt's log lines (tickets/delivery.send)."""
    logs.bind(ticket_id=ticket.id, endpoint=ticket.endpoint.address, trace_id=ticket.trace_id)
    return outgoing_headers(ticket.trace_id)


# --- The trace an API response returns -----------------------------------------------------
# Admission records the ticket's trace here; the request middleware turns it
# into the response's ``traceparent``.

_answer: ContextVar[dict[str, Any] | None] = ContextVar("claimcheck_answer_trace", default=None)


def begin_response() -> Token:
    return _answer.set({})


def end_response(token: Token) -> None:
    _answer.reset(token)


def answer_with(trace_id: str) -> None:
    slot = _answer.get()
    if slot is not None:
        slot["trace_id"] = trace_id


def response_traceparent(incoming: TraceParent | None, token: Token) -> str | None:
    slot = _answer.get() or {}
    trace_id = slot.get("trace_id") or (incoming.trace_id if incoming else None)
    if not trace_id:
        return None
    return traceparent_for(trace_id, flags=incoming.flags if incoming else "01")


# --- Web: request id and the incoming trace ------------------------------------------------

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


def request_id_of(request) -> str:
    """The client's ``X-Request-ID`` when it is a short token, else a new one."""
    given = request.headers.get("X-Request-ID", "")
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex


def _clear_on_finish(**kwargs: Any) -> None:
    logs.clear()


class RequestContextMiddleware:
    """First in the stack: bind ``request_id`` (and the trace id of a valid
    ``traceparent``) for every line logged while the request is handled;
    answer with ``X-Request-ID`` and, when the request concerns a trace,
    ``traceparent``. A malformed ``traceparent`` is
    ignored, never an error.

    The ids stay bound until Django's ``request_finished`` (and are cleared
    again when the thread's next request starts): Django logs a 4xx/5xx
    ("Not Found: …") after the middleware has returned."""

    def __init__(self, get_response):
        from django.core.signals import request_finished  # noqa: PLC0415

        self.get_response = get_response
        request_finished.connect(_clear_on_finish, dispatch_uid="claimcheck-logs-clear")

    def __call__(self, request):
        request_id = request_id_of(request)
        incoming = parse_traceparent(request.headers.get("traceparent", ""))
        request.claimcheck_request_id = request_id
        request.claimcheck_traceparent = incoming
        logs.clear()
        fields: dict[str, Any] = {"request_id": request_id}
        if incoming is not None:
            fields["trace_id"] = incoming.trace_id
        logs.bind(**fields)
        answer = begin_response()
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = request_id
            header = response_traceparent(incoming, answer)
            if header:
                response["traceparent"] = header
            return response
        finally:
            end_response(answer)
