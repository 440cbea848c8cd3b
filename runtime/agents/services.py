"""An owner's decision on a tool call that requires approval.

The decision is recorded like any decision (a ``tool_call_decided`` event
on the waiting ticket: actor, approve or deny, reason) and becomes an
approval ticket on the agent's own endpoint (a child of the waiting ticket,
dedupe key derived from the call, so a repeat converges and a contrary
second decision is a 409). Its turn resumes the exchange once every pending
call has its answer (``runtime/agents/runner.py``)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from core.errors import Forbidden, Invalid, NotFound
from endpoints.selectors import is_owner, resolve_endpoint
from tickets import lifecycle
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketState
from tickets.selectors import may_see

from .runner import approval_key
from .selectors import waiting_continuation

REASON_MAX_CHARS = 2000


def decide_tool_call(
    *, address: str, ticket_id: str, call_id: str, approve: bool, reason: str, user
) -> dict[str, Any]:
    """Approve or deny one pending call; returns ``{ticket, call_id,
    approved, approval_ticket, duplicate}``. Owners and staff only (403); a
    ticket the caller cannot see, of another endpoint, or not waiting on
    that call is 404."""
    endpoint = resolve_endpoint(address)
    try:
        ticket = Ticket.objects.filter(id=uuid.UUID(str(ticket_id)), endpoint=endpoint).first()
    except ValueError:
        ticket = None
    if ticket is None or not may_see(user, ticket):
        raise NotFound(f"ticket {ticket_id} not found")
    if not is_owner(user, endpoint):
        raise Forbidden("only the endpoint's owners may decide its agent's tool calls")
    if not isinstance(reason, str) or not reason.strip():
        raise Invalid("reason must be a non-empty string")
    if len(reason) > REASON_MAX_CHARS:
        raise Invalid(f"reason is at most {REASON_MAX_CHARS} characters")
    cont = waiting_continuation(ticket) if ticket.state == TicketState.WAITING else None
    agent = (cont or {}).get("agent") or {}
    call = agent.get("pending", {}).get(call_id)
    if call is None or call.get("kind") != "approval":
        raise NotFound(f"ticket {ticket.id} has no call {call_id!r} waiting for approval")
    actor = f"user:{user.username}"
    with transaction.atomic():
        admitted = admit_ticket(
            endpoint=endpoint.address,
            input={
                "approval": {
                    "ticket": str(ticket.id),
                    "call_id": call_id,
                    "tool": call.get("tool"),
                    "approved": bool(approve),
                    "reason": reason.strip(),
                    "by": user.username,
                    "continuation": cont,
                }
            },
            dedupe_key=approval_key(str(ticket.id), call_id, agent.get("round") or 1),
            parent_id=ticket.id,
            actor=actor,
        )
        if not admitted.duplicate:
            lifecycle.append_event(
                ticket_id=ticket.id,
                kind="tool_call_decided",
                actor=actor,
                detail={
                    "call_id": call_id,
                    "tool": call.get("tool"),
                    "approved": bool(approve),
                    "reason": reason.strip(),
                    "approval_ticket": str(admitted.ticket.id),
                    "round": agent.get("round") or 1,
                },
            )
    return {
        "ticket": str(ticket.id),
        "call_id": call_id,
        "approved": bool(approve),
        "approval_ticket": str(admitted.ticket.id),
        "duplicate": admitted.duplicate,
    }
