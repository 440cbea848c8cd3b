"""Ticket routes: parse, call one service, render."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from config.errors import Invalid
from endpoints.selectors import resolve_endpoint

from . import admission, delivery, lifecycle, obligations, selectors
from .models import TERMINAL_STATES, Ticket

router = Router(tags=["tickets"])


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class ReturnToIn(Strict):
    endpoint: str = Field(min_length=1, max_length=200)
    continuation: dict[str, Any] | None = None


class RequesterIn(Strict):
    name: str | None = Field(default=None, max_length=200)
    webhook_url: str | None = Field(default=None, max_length=2000)
    metadata: dict[str, Any] | None = None


class TicketIn(Strict):
    endpoint: str = Field(min_length=1, max_length=200)
    dedupe_key: str | None = None
    input: dict[str, Any]
    parent: uuid.UUID | None = None
    trace_id: str | None = None
    return_to: ReturnToIn | None = None
    requester: RequesterIn | None = None
    wait_s: float | None = Field(default=None, ge=0)


def actor_of(request: HttpRequest) -> str:
    return f"user:{request.user.username}"


def wait_for_terminal(ticket: Ticket, wait_s: float) -> Ticket:
    """Poll the ledger until the ticket is terminal or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    pause = 0.02
    while ticket.state not in TERMINAL_STATES:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 1.5, 0.5)
        ticket = selectors.get_ticket(ticket.id)
    return ticket


@router.post("", response={200: dict, 201: dict})
def create_ticket(request: HttpRequest, payload: TicketIn):
    header_key = request.headers.get("Idempotency-Key")
    key = payload.dedupe_key
    if header_key is not None:
        if key is not None and key != header_key:
            raise Invalid("the Idempotency-Key header and dedupe_key differ")
        key = header_key
    if payload.wait_s is not None and payload.wait_s > settings.ADMISSION_MAX_WAIT_S:
        raise Invalid(f"wait_s must be at most {settings.ADMISSION_MAX_WAIT_S}")
    requester = payload.requester.model_dump(exclude_none=True) if payload.requester else {}
    if requester.get("webhook_url"):
        delivery.validate_webhook_url(requester["webhook_url"])
    admitted = admission.admit_ticket(
        endpoint=payload.endpoint,
        input=payload.input,
        dedupe_key=key,
        parent_id=payload.parent,
        trace_id=payload.trace_id,
        return_to=payload.return_to.endpoint if payload.return_to else None,
        continuation=payload.return_to.continuation if payload.return_to else None,
        requester=requester,
        submitted_by_id=request.user.id,
        actor=actor_of(request),
    )
    ticket = admitted.ticket
    if payload.wait_s:
        ticket = wait_for_terminal(selectors.get_ticket(ticket.id), payload.wait_s)
    status = 200 if admitted.duplicate else 201
    return Status(status, selectors.ticket_payload(ticket, duplicate=admitted.duplicate))


@router.get("", response=dict)
def list_tickets(
    request: HttpRequest,
    endpoint: str | None = None,
    state: str | None = None,
    trace_id: str | None = None,
    limit: int = Query(50),
    cursor: str | None = None,
):
    endpoint_id = resolve_endpoint(endpoint).id if endpoint else None
    rows, next_cursor = selectors.list_tickets(
        endpoint_id=endpoint_id, state=state, trace_id=trace_id, limit=limit, cursor=cursor
    )
    return {"items": [selectors.ticket_payload(t) for t in rows], "next_cursor": next_cursor}


@router.get("/{ticket_id}", response=dict)
def get_ticket(request: HttpRequest, ticket_id: str):
    return selectors.ticket_payload(selectors.get_ticket(ticket_id))


@router.get("/{ticket_id}/events", response=list[dict])
def get_events(request: HttpRequest, ticket_id: str):
    ticket = selectors.get_ticket(ticket_id)
    return [selectors.event_payload(e) for e in selectors.ticket_events(ticket.id)]


@router.get("/{ticket_id}/lineage", response=dict)
def get_lineage(request: HttpRequest, ticket_id: str):
    return selectors.lineage(selectors.get_ticket(ticket_id))


@router.post("/{ticket_id}/cancel", response=dict)
def cancel(request: HttpRequest, ticket_id: str):
    ticket = selectors.get_ticket(ticket_id)
    lifecycle.cancel_ticket(ticket_id=ticket.id, actor=actor_of(request))
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


@router.post("/{ticket_id}/approve", response=dict)
def approve(request: HttpRequest, ticket_id: str):
    ticket = selectors.get_ticket(ticket_id)
    delivery.approve_ticket(ticket_id=ticket.id, user=request.user)
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


class AckIn(Strict):
    note: str | None = Field(default=None, max_length=2000)


@router.post("/{ticket_id}/delivery/ack", response=dict)
def ack_delivery(request: HttpRequest, ticket_id: str, payload: AckIn | None = None):
    ticket = selectors.get_ticket(ticket_id)
    delivery.acknowledge(ticket_id=ticket.id, actor=actor_of(request))
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


# --- Obligations (tickets/obligations.py) ------------------------------------------------------


class ObligationCloseIn(Strict):
    note: str = Field(min_length=1, max_length=2000)


class ObligationIn(Strict):
    next_update_at: datetime | None = None
    note: str | None = Field(default=None, max_length=2000)


@router.post("/{ticket_id}/obligation/close", response=dict)
def close_obligation(request: HttpRequest, ticket_id: str, payload: ObligationCloseIn):
    ticket = selectors.get_ticket(ticket_id)
    obligations.close_obligation(ticket_id=ticket.id, user=request.user, note=payload.note)
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))


@router.post("/{ticket_id}/obligation", response=dict)
def update_obligation(request: HttpRequest, ticket_id: str, payload: ObligationIn):
    ticket = selectors.get_ticket(ticket_id)
    obligations.update_obligation(
        ticket_id=ticket.id,
        user=request.user,
        next_update_at=payload.next_update_at,
        note=payload.note,
    )
    return selectors.ticket_payload(selectors.get_ticket(ticket.id))
