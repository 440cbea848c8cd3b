"""The delivery state machine: an owner's approval, a pull
acknowledgement (the edges are in the package docstring). A delivery is
opened by the database, in the move that makes a ticket that answers a
requester terminal (tickets/sql/claimcheck_ticket_owes.sql), its send
published by tickets/terminal.py ``after_move``."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from core import outbound
from core.dispatch import DELIVER, publish
from core.errors import Forbidden, InvalidTransition, NotFound
from endpoints.selectors import is_owner

from ..events import update_fields
from ..models import Delivery, DeliveryState, ObligationState, Ticket

log = logging.getLogger(__name__)


def validate_webhook_url(url: str) -> None:
    """Refuse, at admission, a webhook target we must not call."""
    outbound.validate_outbound_url(url, label="webhook")


def locked_ticket(ticket_id: uuid.UUID) -> Ticket:
    ticket = Ticket.objects.select_for_update().filter(id=ticket_id).first()
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


def approve_ticket(*, ticket_id: uuid.UUID, user, reason: str = "") -> Ticket:
    """An owner releases the delivery of a terminal ticket whose endpoint
    requires approval: ``awaiting_approval -> pending`` and, for a webhook,
    the send is published after commit.

    Refused with 403 for anyone but the endpoint's owners (or staff), and with
    409 ``invalid_transition`` for a ticket that is not terminal or whose
    delivery does not await approval (a child, or an endpoint without the
    gate). Approving an already approved ticket is a no-op that returns it
    unchanged, so a retried request is safe; the first approval's actor and
    time stay on record.
    """
    ticket = Ticket.objects.select_related("endpoint").filter(id=ticket_id).first()
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    if not is_owner(user, ticket.endpoint):
        raise Forbidden(f"only an owner of {ticket.endpoint.address} may approve its results")
    with transaction.atomic():
        ticket = locked_ticket(ticket_id)
        if not ticket.is_terminal:
            raise InvalidTransition(
                f"ticket {ticket_id} is {ticket.state}: only a finished ticket can be approved",
                state=ticket.state,
            )
        if ticket.approved_at is not None:
            return ticket  # already approved: nothing to do
        if ticket.delivery_state != DeliveryState.AWAITING_APPROVAL:
            raise InvalidTransition(
                f"ticket {ticket_id} does not await approval (delivery {ticket.delivery_state})",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        delivery = Delivery.objects.select_for_update().get(ticket_id=ticket_id)
        now = timezone.now()
        update_fields(
            ticket_id=ticket_id,
            kind="approved",
            actor=f"user:{user.username}",
            detail={"delivery": str(delivery.id), **({"reason": reason} if reason else {})},
            approved_at=now,
            approved_by=user,
            delivery_state=DeliveryState.PENDING,
        )
        if delivery.mode == Delivery.Mode.WEBHOOK:
            Delivery.objects.filter(id=delivery.id).update(next_attempt_at=now)
            publish(DELIVER, str(delivery.id))
    return Ticket.objects.get(id=ticket_id)


def closed_obligation(ticket: Ticket) -> dict[str, Any]:
    """Fields that close the ticket's obligation, if it is still open."""
    if ticket.obligation_state != ObligationState.OPEN:
        return {}
    return {"obligation_state": ObligationState.CLOSED, "obligation_due_at": None}


def acknowledge(*, ticket_id: uuid.UUID, actor: str) -> Ticket:
    """The requester took a pull delivery: ``pending | attempted ->
    delivered``, and the obligation closes. 409 ``invalid_transition`` for a
    ticket with no open pull delivery: not finished (or not a root), awaiting
    approval, a webhook delivery, or already delivered."""
    with transaction.atomic():
        ticket = locked_ticket(ticket_id)
        delivery = Delivery.objects.select_for_update().filter(ticket_id=ticket_id).first()
        if delivery is None:
            raise InvalidTransition(
                f"ticket {ticket_id} is {ticket.state} and has nothing to deliver "
                "(a delivery opens when a root ticket finishes)",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        if delivery.mode != Delivery.Mode.PULL:
            raise InvalidTransition(
                f"ticket {ticket_id} is delivered by webhook; the receiver's 2xx acknowledges it",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        if ticket.delivery_state not in (DeliveryState.PENDING, DeliveryState.ATTEMPTED):
            raise InvalidTransition(
                f"ticket {ticket_id}'s delivery is {ticket.delivery_state}; only a pending "
                "delivery can be acknowledged",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        now = timezone.now()
        Delivery.objects.filter(id=delivery.id).update(delivered_at=now, next_attempt_at=None)
        update_fields(
            ticket_id=ticket_id,
            kind="delivery_acknowledged",
            actor=actor,
            detail={"delivery": str(delivery.id)},
            delivery_state=DeliveryState.DELIVERED,
            **closed_obligation(ticket),
        )
    return Ticket.objects.get(id=ticket_id)
