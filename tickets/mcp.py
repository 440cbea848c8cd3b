"""The ticket tools of the MCP server at ``/mcp`` (config/mcp.py, docs/reference/mcp.md).

Each tool is a route of the API by another door: its arguments are the
route's (the same pydantic models where the route has a body), and it calls
the very functions the route calls (``tickets.api``'s handlers, visibility,
the wait), so limits, validation, authorisation and errors cannot drift
apart. A ticket the caller may not see is ``not_found``, exactly as an
unknown id.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from pydantic import Field

from core import fairshare, limits
from core.errors import Invalid
from core.schemas import Out, Strict
from core.tools import Tool
from endpoints.selectors import resolve_endpoint

from . import api, selectors
from . import search as search_terms
from .models import TERMINAL_STATES
from .schemas import EventOut, LineageOut, TicketOut, TicketPage

# A wait holds the request's thread, as the API's ``wait_s`` does: never
# longer than the API allows one (ADMISSION_MAX_WAIT_S), and never over a minute.
WAIT_CAP_S = 60.0


def wait_cap_s() -> float:
    return min(WAIT_CAP_S, settings.ADMISSION_MAX_WAIT_S)


_TICKET_ID = Field(description="The ticket's id (a UUID), as submit_ticket or a list returned it.")


class SubmitIn(api.TicketIn):
    """POST /api/v1/tickets's body, with the dedupe key required: a key the
    server made up could not recognise the retry of a call whose answer was
    lost (the retry would come without it)."""

    dedupe_key: str = Field(
        min_length=1,
        max_length=limits.DEDUPE_KEY_CHARS,
        description=(
            "Names this request (1 to 255 printable characters). Submitting again with the "
            "same key and input returns the same ticket (duplicate: true); the same key with "
            "another input is dedupe_conflict. Reuse it when you retry."
        ),
    )
    wait_s: float | None = Field(
        default=None,
        ge=0,
        le=WAIT_CAP_S,
        strict=True,
        description="Wait up to this many seconds (at most 60) for a terminal state before "
        "answering; the ticket is returned as it then stands.",
    )


class TicketIdIn(Strict):
    ticket_id: str = _TICKET_ID


class WaitIn(Strict):
    ticket_id: str = _TICKET_ID
    wait_s: float = Field(
        default=30.0,
        gt=0,
        le=WAIT_CAP_S,
        description="How long to wait for a terminal state, in seconds (at most 60, or the "
        "server's ADMISSION_MAX_WAIT_S if lower).",
    )


class ListIn(Strict):
    endpoint: str | None = Field(default=None, max_length=limits.ADDRESS_CHARS)
    state: str | None = Field(
        default=None,
        description="queued, running, waiting, succeeded, failed, cancelled, recovering, orphaned",
    )
    trace_id: str | None = Field(default=None, max_length=limits.TRACE_ID_CHARS)
    limit: int = Field(default=50, ge=1, le=selectors.MAX_PAGE)
    cursor: str | None = Field(
        default=None, description="next_cursor of the previous page, for the next one."
    )


class SearchIn(Strict):
    q: str = Field(
        min_length=1,
        max_length=search_terms.MAX_CHARS,
        description="A ticket id (whole, or its head or tail of 4+ characters), a dedupe "
        "key, or a trace id; and/or terms inside input and result, all of which must hold: "
        'input.customer:42, result.status:"needs review" (docs/reference/api.md, Search).',
    )
    endpoint: str | None = Field(default=None, max_length=limits.ADDRESS_CHARS)
    state: str | None = None
    limit: int = Field(default=50, ge=1, le=selectors.MAX_PAGE)
    cursor: str | None = None


class EventsOut(Out):
    ticket: str
    events: list[EventOut]


# --- What each tool runs: the route's own functions -----------------------------------------


def submit(request: HttpRequest, params: SubmitIn) -> dict[str, Any]:
    # The route answers already rendered (tickets.api.rendered: the hot path
    # skips ninja's validation of its own output); the tool reads it back.
    return json.loads(api.create_ticket(request, params).content)


def get(request: HttpRequest, params: TicketIdIn) -> dict[str, Any]:
    return api.get_ticket(request, params.ticket_id)


def wait(request: HttpRequest, params: WaitIn) -> dict[str, Any]:
    cap = wait_cap_s()
    if params.wait_s > cap:
        raise Invalid(f"wait_s must be at most {cap:g}")
    ticket = api.visible(request, params.ticket_id)
    if ticket.state in TERMINAL_STATES:
        return selectors.ticket_payload(ticket)
    # A wait slot, as the API's wait_s takes one; none free is rate_limited.
    with fairshare.required_wait_slot(request.user):
        return selectors.ticket_payload(api.wait_for_terminal(ticket, params.wait_s))


def list_(request: HttpRequest, params: ListIn) -> dict[str, Any]:
    return api.list_tickets(
        request,
        endpoint=params.endpoint,
        state=params.state,
        trace_id=params.trace_id,
        limit=params.limit,
        cursor=params.cursor,
    )


def search(request: HttpRequest, params: SearchIn) -> dict[str, Any]:
    endpoint_id = resolve_endpoint(params.endpoint).id if params.endpoint else None
    rows, next_cursor = selectors.find_tickets(
        user=request.user,
        q=params.q,
        endpoint_id=endpoint_id,
        state=params.state,
        limit=params.limit,
        cursor=params.cursor,
    )
    return {"items": [selectors.ticket_payload(t) for t in rows], "next_cursor": next_cursor}


def events(request: HttpRequest, params: TicketIdIn) -> dict[str, Any]:
    return {"ticket": params.ticket_id, "events": api.get_events(request, params.ticket_id)}


def lineage(request: HttpRequest, params: TicketIdIn) -> dict[str, Any]:
    return api.get_lineage(request, params.ticket_id)


TOOLS = [
    Tool(
        name="submit_ticket",
        title="Submit a ticket",
        description=(
            "Ask an endpoint to do work: admits a ticket (POST /api/v1/tickets) and returns it. "
            "dedupe_key is required: the same key and input return the same ticket "
            "(duplicate: true). With wait_s the call waits up to that long for a terminal "
            "state. The work runs asynchronously: follow it with wait_for_ticket or get_ticket. "
            "A request that declares the MCP tasks extension gets a task (its id the ticket's) "
            "while the ticket has not finished (docs/reference/mcp.md, Tasks)."
        ),
        params=SubmitIn,
        output=TicketOut,
        run=submit,
        read_only=False,
        # The dedupe key makes a repeat return the same ticket.
        idempotent=True,
    ),
    Tool(
        name="get_ticket",
        title="Get a ticket",
        description="A ticket as it stands now (GET /api/v1/tickets/{id}): state, result, "
        "error, turn, callback, delivery. A ticket you may not see is not_found.",
        params=TicketIdIn,
        output=TicketOut,
        run=get,
    ),
    Tool(
        name="wait_for_ticket",
        title="Wait for a ticket",
        description="Wait up to wait_s seconds (at most 60) for a ticket to reach a terminal "
        "state (succeeded, failed, cancelled, orphaned) and return it as it then stands. "
        "Returns early when it ends; check state to see whether it did.",
        params=WaitIn,
        output=TicketOut,
        run=wait,
    ),
    Tool(
        name="list_tickets",
        title="List tickets",
        description="Tickets you may see, newest first, filtered by endpoint, state and "
        "trace_id (GET /api/v1/tickets); pass next_cursor back as cursor for the next page.",
        params=ListIn,
        output=TicketPage,
        run=list_,
    ),
    Tool(
        name="search_tickets",
        title="Search tickets",
        description="Find tickets you may see by id (whole or a head or tail of it), dedupe "
        "key or trace id, and by key and value inside input and result (input.customer:42), "
        "like the console's search box; filters and cursor as list_tickets.",
        params=SearchIn,
        output=TicketPage,
        run=search,
    ),
    Tool(
        name="get_ticket_events",
        title="A ticket's events",
        description="A ticket's events, oldest first (GET /api/v1/tickets/{id}/events): every "
        "state change with its actor, turn and detail.",
        params=TicketIdIn,
        output=EventsOut,
        run=events,
    ),
    Tool(
        name="get_lineage",
        title="A ticket's lineage",
        description="The tickets of a ticket's trace that you may see: parents, children, "
        "callbacks and re-runs (GET /api/v1/tickets/{id}/lineage).",
        params=TicketIdIn,
        output=LineageOut,
        run=lineage,
    ),
]
