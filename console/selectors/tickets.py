"""The ticket list (search and filters, keyset-paginated) and a ticket's
page (its record, timeline, turns, delivery, children and re-runs, and
which actions its user may take). Every ticket comes through
``tickets.selectors`` (``find_tickets``, ``get_visible_ticket``,
``visible_tickets``): a stranger's ticket is 404, as an unknown one."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.http import Http404

from console.forms import utc_param
from core.errors import DomainError, InvalidSearch, NotFound
from endpoints.models import Endpoint
from endpoints.selectors import is_owner, resolve_endpoint
from recovery.models import CaseState
from recovery.selectors import visible_cases
from tickets import retry
from tickets import selectors as ticket_selectors
from tickets.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    ObligationState,
    Ticket,
    TicketState,
    Turn,
)
from tickets.selectors import visible_tickets

from . import LIST_CAP
from .obligations import awaiting_pickup, requester_lacks

TICKETS_PAGE = 50
CANCELLABLE = {TicketState.QUEUED, TicketState.WAITING, TicketState.RUNNING}
DELIVERY_FILTERS = [
    (DeliveryState.AWAITING_APPROVAL, "awaiting approval"),
    (DeliveryState.PENDING, "pending"),
    (DeliveryState.ATTEMPTED, "attempted"),
    (DeliveryState.FAILED, "failed"),
    (DeliveryState.DELIVERED, "delivered"),
]
FILTERS = ("q", "endpoint", "state", "delivery", "since", "until", "trace_id")


def ticket_list_page(*, user, params) -> dict[str, Any]:
    """The list as ``params`` (the query string) filter it. A filter the
    search refuses is the page's ``error`` (answered 400), the form kept."""
    filters = {key: params.get(key, "").strip() for key in FILTERS}
    # The trace filter of earlier links is the search box now.
    if filters["trace_id"] and not filters["q"]:
        filters["q"] = filters["trace_id"]
    cursor = params.get("cursor", "").strip() or None
    live_token = None if cursor else ticket_selectors.ledger_change_token()  # before the rows
    rows, next_cursor, error, search_error = [], None, None, False
    try:
        endpoint_id = resolve_endpoint(filters["endpoint"]).id if filters["endpoint"] else None
        rows, next_cursor = ticket_selectors.find_tickets(
            user=user,
            q=filters["q"],
            endpoint_id=endpoint_id,
            state=filters["state"] or None,
            delivery_state=filters["delivery"] or None,
            since=utc_param(filters["since"], "since"),
            until=utc_param(filters["until"], "until"),
            limit=TICKETS_PAGE,
            cursor=cursor,
        )
    except DomainError as exc:
        error = exc.detail
        search_error = exc.code == InvalidSearch.code
    return {
        "filters": filters,
        "search_error": search_error,
        "tickets": rows,
        "cursor": cursor,
        "next_cursor": next_cursor,
        "error": error,
        "states": TicketState.values,
        "deliveries": DELIVERY_FILTERS,
        "endpoints": endpoint_choices(),
        "selectable": True,
        "live_token": live_token,
    }


def visible_ticket(ticket_id: uuid.UUID | str, *, user) -> Ticket:
    """The ticket, if ``user`` may see it; 404 exactly as for an unknown id
    (and for a malformed one)."""
    try:
        return ticket_selectors.get_visible_ticket(ticket_id, user=user)
    except (NotFound, ValueError):
        raise Http404("ticket not found") from None


@dataclass
class TicketDetail:
    ticket: Ticket
    payload: dict[str, Any]
    events: list
    turns: list[Turn]
    delivery: Delivery | None
    attempts: list[DeliveryAttempt] = field(default_factory=list)
    children: list[Ticket] = field(default_factory=list)
    reruns: list[Ticket] = field(default_factory=list)


def ticket_detail(ticket_id: uuid.UUID, *, user) -> TicketDetail:
    """A ticket the user may see (else ``NotFound``), with its children and
    re-runs the user may see."""
    ticket = ticket_selectors.get_visible_ticket(ticket_id, user=user)
    visible = visible_tickets(user)
    delivery = Delivery.objects.filter(ticket_id=ticket.id).first()
    return TicketDetail(
        ticket=ticket,
        payload=ticket_selectors.ticket_payload(ticket),
        events=ticket_selectors.ticket_events(ticket.id),
        # Usually one; the turn index on ticket_id keeps this cheap.
        turns=list(Turn.objects.filter(ticket_id=ticket.id).order_by("seq")),
        delivery=delivery,
        attempts=list(delivery.attempt_log.order_by("number")[:50]) if delivery else [],
        reruns=list(visible.filter(rerun_of_id=ticket.id).order_by("id")),
        children=list(
            visible.filter(parent_id=ticket.id).select_related("endpoint").order_by("id")[:LIST_CAP]
        ),
    )


def endpoint_choices() -> list[str]:
    return list(Endpoint.objects.order_by("address").values_list("address", flat=True))


def ticket_page(ticket_id: uuid.UUID, *, user) -> dict[str, Any]:
    """A ticket's page for ``user`` (404 for one they may not see): the
    record and, for each action, whether they may take it now."""
    live_token = ticket_selectors.change_token(ticket_id)  # before what it covers
    try:
        detail = ticket_detail(ticket_id, user=user)
    except NotFound:
        raise Http404("ticket not found") from None
    ticket = detail.ticket
    return {
        "t": detail,
        "ticket": ticket,
        "can_approve": ticket.delivery_state == DeliveryState.AWAITING_APPROVAL
        and is_owner(user, ticket.endpoint),
        "requester_lacks": requester_lacks(ticket)
        if ticket.obligation_state == ObligationState.OPEN
        else None,
        "awaiting_pickup": awaiting_pickup(ticket),
        "can_manage_obligation": ticket.obligation_state == ObligationState.OPEN
        and is_owner(user, ticket.endpoint),
        # Whoever sees a ticket may cancel it (API.md), while it can be.
        "can_cancel": ticket.state in CANCELLABLE and not ticket.cancel_requested_at,
        "open_case": visible_cases(user)
        .filter(ticket_id=ticket.id, state__in=[CaseState.OPEN, CaseState.DECIDED])
        .order_by("-opened_at")
        .first(),
        # An owner, or the submitter for their own ticket, may retry it once.
        "can_retry": ticket.state in retry.RETRYABLE
        and not ticket.callback_for_id
        and not detail.payload["retry"]
        and (ticket.submitted_by_id == user.pk or is_owner(user, ticket.endpoint)),
        "retry_form": {"input": json.dumps(ticket.input, indent=2, sort_keys=True), "budget_s": ""},
        "live_token": live_token,
    }


def may_manage(ticket: Ticket, *, user) -> bool:
    """May ``user`` approve the ticket's result or manage its obligation?
    Its endpoint's owners and staff."""
    return is_owner(user, ticket.endpoint)
