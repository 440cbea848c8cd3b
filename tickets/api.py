"""Ticket routes: parse, call one service, render."""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextlib import nullcontext
from datetime import datetime
from typing import Annotated, Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Status
from ninja.renderers import JSONRenderer

from core import fairshare, limits, tracing
from core.errors import Invalid
from core.schemas import Strict
from core.times import as_utc
from core.transient import TRANSIENT_ERRORS, answer_by, describe, drop_broken_connection
from endpoints.selectors import resolve_endpoint

from . import admission, budgets, delivery, obligations, retry, selectors, streams, traces, waits
from . import search as search_terms
from .models import TERMINAL_STATES, Ticket
from .schemas import EventOut, LineageOut, TicketOut, TicketPage
from .turns import interrupt

log = logging.getLogger(__name__)
router = Router(tags=["tickets"])

# What a committed admission's answer may take past its ``wait_s`` to read
# the ticket back: past it, the ticket as last read.
READ_BACK_S = 1.0


class ReturnToIn(Strict):
    endpoint: str = Field(min_length=1, max_length=limits.ADDRESS_CHARS)
    continuation: dict[str, Any] | None = None


class RequesterIn(Strict):
    name: str | None = Field(default=None, max_length=limits.NAME_CHARS)
    webhook_url: str | None = Field(default=None, max_length=limits.URL_CHARS)
    metadata: dict[str, Any] | None = None


class BudgetIn(Strict):
    """A trace's budget (docs/howto/trace-budgets.md): at least one limit."""

    tokens: int | None = Field(default=None, ge=1, le=10**15, strict=True)
    cost: float | None = Field(default=None, gt=0, le=10**15)
    wall_s: float | None = Field(default=None, gt=0, le=10**9)


class TicketIn(Strict):
    endpoint: str = Field(min_length=1, max_length=limits.ADDRESS_CHARS)
    dedupe_key: str | None = None
    input: dict[str, Any]
    parent: uuid.UUID | None = None
    trace_id: str | None = None
    return_to: ReturnToIn | None = None
    requester: RequesterIn | None = None
    wait_s: float | None = Field(default=None, ge=0, strict=True)  # "5" is not a number
    # The trace's budget, set by the root that opens it (docs/howto/trace-budgets.md).
    budget: BudgetIn | None = None


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.username}"


def visible(request: HttpRequest, ticket_id: str) -> Ticket:
    """Every route that names a ticket starts here: a ticket the caller may
    not see is 404, exactly like an unknown id, before anything is read or
    changed. Seeing is enough to cancel and to acknowledge a delivery
    (submitter, owners, staff); approving and obligations are the owners'
    (their services answer 403 to a submitter)."""
    return selectors.get_visible_ticket(ticket_id, user=request.user)


def answer_admitted(request: HttpRequest, admitted: admission.Admitted, wait_s: float | None):
    """The answer to a committed admission: 201 (200 for a duplicate) with
    the ticket as it stands, never an error (API.md: a committed admission
    is never 503). With ``wait_s`` it waits for a terminal state when a
    wait slot is free (core/fairshare.py; none free: it answers at once);
    a wait or a re-read that meets a transient fault (the database or the
    listener's connection gone) answers with the ticket as it was last
    read, else as it was committed. Its reads end by the request's own
    deadline, ``wait_s`` and ``READ_BACK_S`` after the commit, however long
    a pooler would hold them (``answer_by``)."""
    status = 200 if admitted.duplicate else 201
    # Built before any wait: a new ticket's row and endpoint are at hand
    # (admission returns them), so this normally costs no query.
    body = selectors.ticket_payload(admitted.ticket, duplicate=admitted.duplicate)
    if not wait_s or admitted.ticket.state in TERMINAL_STATES:
        return rendered(request, status, body)
    with fairshare.wait_slot(request.user) as granted:
        if not granted:  # the ticket as admission just read it, at once
            return rendered(request, status, body)
        try:
            with answer_by(time.monotonic() + wait_s + READ_BACK_S):
                ticket = wait_for_terminal(selectors.get_ticket(admitted.ticket.id), wait_s)
                body = selectors.ticket_payload(ticket, duplicate=admitted.duplicate)
        except TRANSIENT_ERRORS as exc:
            drop_broken_connection()
            log.warning(
                "ticket %s was admitted; its wait_s met a transient fault (%s): "
                "answering %d with the ticket as last read",
                admitted.ticket.id,
                describe(exc),
                status,
            )
    return rendered(request, status, body)


def rendered(request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
    """The admission's answer rendered as ninja renders a route's result,
    without validating through ``TicketOut`` a dict ``ticket_payload`` built
    to its shape (a third of ninja's work on the hottest route;
    tests/tickets/test_admission.py checks the two agree)."""
    content = _RENDERER.render(request, body, response_status=status)
    return HttpResponse(content, status=status, content_type=_CONTENT_TYPE)


# The API's renderer (config/api.py keeps ninja's default).
_RENDERER = JSONRenderer()
_CONTENT_TYPE = f"{_RENDERER.media_type}; charset={_RENDERER.charset}"


def wait_for_terminal(ticket: Ticket, wait_s: float) -> Ticket:
    """Wait until the ticket is terminal or ``wait_s`` has passed: woken by
    the NOTIFY of its terminal transition (tickets/waits.py), no polling.
    Reads by id a ticket the caller has just been given (theirs, or one
    admission found visible to them): no visibility check per read."""
    if ticket.state in TERMINAL_STATES:
        return ticket
    return waits.wait_until_terminal(
        ticket, wait_s, selectors.get_ticket, lambda t: t.state in TERMINAL_STATES
    )


@router.post("", response={200: TicketOut, 201: TicketOut})
def create_ticket(request: HttpRequest, payload: TicketIn):
    header_key = request.headers.get("Idempotency-Key")
    key = payload.dedupe_key
    if header_key is not None:
        if key is not None and key != header_key:
            raise Invalid("the Idempotency-Key header and dedupe_key differ")
        key = header_key
    if payload.wait_s is not None and payload.wait_s > settings.ADMISSION_MAX_WAIT_S:
        raise Invalid(f"wait_s must be at most {settings.ADMISSION_MAX_WAIT_S}")
    # A budget belongs to the trace its root opens: a child spends its
    # trace's budget and may not set one (400, not silently ignored).
    budget = budgets.validate_budget(
        payload.budget.model_dump(exclude_none=True) if payload.budget else None
    )
    if budget is not None and payload.parent is not None:
        raise Invalid("budget is set by a root ticket; a child spends its trace's budget")
    fairshare.check_admission(request.user)  # 429 before anything is looked up
    requester = payload.requester.model_dump(exclude_none=True) if payload.requester else {}
    if requester.get("webhook_url"):
        delivery.validate_webhook_url(requester["webhook_url"])
    # A trace the caller may not see does not exist for it: the choice is
    # its own trace then, held (locked) until the admission commits.
    with traces.joining(
        request.user,
        requested=tracing.admission_trace_id(
            request, parent=payload.parent, given=payload.trace_id
        ),
        parent=payload.parent,
        traceparent=tracing.incoming_traceparent(request) if payload.trace_id is None else None,
    ) as trace:
        if trace.link is not None:
            requester = {**requester, "trace_link": trace.link}
        # With a budget, the admission and the budget commit together (a
        # refused budget admits nothing); without one, the one-statement path.
        with transaction.atomic() if budget is not None else nullcontext():
            admitted = admission.admit_ticket(
                endpoint=payload.endpoint,
                input=payload.input,
                dedupe_key=key,
                parent_id=payload.parent,
                trace_id=trace.trace_id,
                return_to=payload.return_to.endpoint if payload.return_to else None,
                continuation=payload.return_to.continuation if payload.return_to else None,
                requester=requester,
                submitter=request.user,
                actor=actor_of(request),
            )
            if budget is not None and not admitted.duplicate:
                budgets.open_budget(
                    trace_id=admitted.ticket.trace_id, ticket_id=admitted.ticket.id, budget=budget
                )
    return answer_admitted(request, admitted, payload.wait_s)


@router.get("", response=TicketPage)
def list_tickets(
    request: HttpRequest,
    endpoint: str | None = None,
    state: str | None = None,
    trace_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    # Annotated, not a Query(...) default: the MCP tool calls this function
    # without it. Its length is the parser's to refuse (400 invalid_search).
    search: Annotated[
        str | None,
        Query(
            description="Terms inside input and result, all of which must hold: "
            "`input.<key>[.<key>...]:<value>` or `result.<key>...:<value>`, separated by "
            f"spaces, at most {search_terms.MAX_CHARS} characters (docs/reference/api.md, Search). "
            "400 `invalid_search` when one does not parse."
        ),
    ] = None,
    limit: int = Query(50, ge=1, le=selectors.MAX_PAGE),
    cursor: str | None = None,
):
    endpoint_id = resolve_endpoint(endpoint).id if endpoint else None
    rows, next_cursor = selectors.list_tickets(
        user=request.user,
        endpoint_id=endpoint_id,
        state=state,
        trace_id=trace_id,
        since=as_utc(since, "since"),
        until=as_utc(until, "until"),
        search_text=search,
        limit=limit,
        cursor=cursor,
    )
    return {"items": [selectors.ticket_payload(t) for t in rows], "next_cursor": next_cursor}


@router.get("/{ticket_id}", response=TicketOut)
def get_ticket(request: HttpRequest, ticket_id: str):
    return selectors.ticket_payload(visible(request, ticket_id))


@router.get("/{ticket_id}/events", response=list[EventOut])
def get_events(request: HttpRequest, ticket_id: str):
    ticket = visible(request, ticket_id)
    return [selectors.event_payload(e) for e in selectors.ticket_events(ticket.id)]


_EVENT_ID = re.compile(r"[0-9]{1,18}")  # a bigint, ASCII digits only
_STREAM_DOC = {
    "responses": {
        200: {
            "description": "Server-Sent Events: each ledger event of the ticket as `id:` its id, "
            "`event:` its kind, `data:` the JSON of a `GET /tickets/{id}/events` item; "
            "`: keep-alive` comments while nothing happens; `event: end` (data "
            '`{"state": ...}`) once the ticket is terminal. It ends without `end` after '
            "`STREAM_MAX_S`: reconnect with `Last-Event-ID` (docs/howto/streaming.md).",
            # OpenAPI 3.2's itemSchema: each SSE message of the stream.
            "content": {
                streams.MEDIA_TYPE: {
                    "itemSchema": {
                        "type": "object",
                        "required": ["event", "data"],
                        "properties": {
                            "id": {
                                "type": "string",
                                "description": "The event's id (none on `delta` and `end`).",
                            },
                            "event": {
                                "type": "string",
                                "description": "The event's kind, `delta` or `end`.",
                            },
                            "data": {
                                "type": "string",
                                "description": "JSON: an `EventOut` (`end`: `{state}`).",
                                "contentMediaType": "application/json",
                                "contentSchema": {
                                    "anyOf": [
                                        {"$ref": "#/components/schemas/EventOut"},
                                        {
                                            "type": "object",
                                            "required": ["state"],
                                            "properties": {"state": {"type": "string"}},
                                        },
                                    ]
                                },
                            },
                        },
                    },
                }
            },
        }
    }
}


@router.get("/{ticket_id}/stream", response={200: None}, openapi_extra=_STREAM_DOC)
def stream_ticket(
    request: HttpRequest,
    ticket_id: str,
    last_event_id: int | None = Query(
        None,
        ge=0,
        description="Resume after this event id (the `Last-Event-ID` header wins when both "
        "are given).",
    ),
):
    """The ticket's steps as they happen, from the ledger (tickets/streams.py):
    authorised like ``GET /tickets/{id}`` (404 before anything is streamed),
    then 429 ``rate_limited`` when the caller's streams are at their limit."""
    ticket = visible(request, ticket_id)
    header = request.headers.get("Last-Event-ID")
    if header is not None and header.strip():
        if not _EVENT_ID.fullmatch(header.strip()):
            raise Invalid("Last-Event-ID must be an event id (a non-negative integer)")
        last_event_id = int(header.strip())
    release = fairshare.stream_slot(request.user)
    return streams.response(ticket.id, after=last_event_id or 0, release=release)


@router.get("/{ticket_id}/lineage", response=LineageOut)
def get_lineage(request: HttpRequest, ticket_id: str):
    return selectors.lineage(visible(request, ticket_id), user=request.user)


@router.post("/{ticket_id}/approve", response=TicketOut)
def approve(request: HttpRequest, ticket_id: str):
    ticket = visible(request, ticket_id)
    delivery.approve_ticket(ticket_id=ticket.id, user=request.user)
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


class RetryIn(Strict):
    reason: str = Field(min_length=1, max_length=retry.REASON_CHARS)
    input: dict[str, Any] | None = None
    budget_s: int | None = Field(default=None, ge=1, strict=True)


@router.post("/{ticket_id}/retry", response={201: TicketOut})
def retry_ticket(request: HttpRequest, ticket_id: str, payload: RetryIn):
    """A failed, cancelled or orphaned ticket admitted again as a new ticket
    (``retry_of`` names the original), by an owner or its submitter."""
    # The service answers 404 for a ticket the caller may not see, then 403.
    new = retry.retry_ticket(
        ticket_id=ticket_id,
        user=request.user,
        reason=payload.reason,
        input=payload.input,
        budget_s=payload.budget_s,
    )
    return Status(201, selectors.ticket_payload(new))


class AckIn(Strict):
    note: str | None = Field(default=None, max_length=limits.NOTE_CHARS)


@router.post("/{ticket_id}/delivery/ack", response=TicketOut)
def ack_delivery(request: HttpRequest, ticket_id: str, payload: AckIn | None = None):
    ticket = visible(request, ticket_id)
    delivery.acknowledge(ticket_id=ticket.id, actor=actor_of(request))
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


# --- Obligations (tickets/obligations.py) ------------------------------------------------------


class ObligationCloseIn(Strict):
    note: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


class ObligationIn(Strict):
    next_update_at: datetime | None = None
    note: str | None = Field(default=None, max_length=limits.NOTE_CHARS)


@router.post("/{ticket_id}/obligation/close", response=TicketOut)
def close_obligation(request: HttpRequest, ticket_id: str, payload: ObligationCloseIn):
    ticket = visible(request, ticket_id)
    obligations.close_obligation(ticket_id=ticket.id, user=request.user, note=payload.note)
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


@router.post("/{ticket_id}/obligation", response=TicketOut)
def update_obligation(request: HttpRequest, ticket_id: str, payload: ObligationIn):
    ticket = visible(request, ticket_id)
    obligations.update_obligation(
        ticket_id=ticket.id,
        user=request.user,
        next_update_at=payload.next_update_at,
        note=payload.note,
    )
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


# --- A ticket's cancel (tickets/turns/interrupt.py) ---------------------------------------------
#
# A running ticket's turn is asked to stop. The operation id is the one this
# route had when the runtime served it: clients generated from the OpenAPI
# document keep their method name.


@router.post("/{ticket_id}/cancel", response=TicketOut, operation_id="runtime_api_cancel")
def cancel(request: HttpRequest, ticket_id: str):
    ticket = visible(request, ticket_id)
    interrupt.cancel_ticket(ticket_id=ticket.id, actor=actor_of(request))
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))
