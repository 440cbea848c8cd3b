"""Retry: a failed, cancelled or orphaned ticket admitted again as a new ticket.

A retry is new work with a new identity, never a second run of the old
ticket: the original keeps its state, result and turn; the retry names it in
``retry_of`` (and the original's ``retries`` names the retry). A ticket is
retried at most once (the partial unique constraint ``ticket_retry_of_unique``):
a double click converges on the first retry, and trying again after a retry
failed means retrying the retry, so the chain reads in order.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction

from core import limits
from core.errors import Forbidden, Invalid, InvalidTransition
from endpoints.selectors import is_owner

from . import lifecycle
from .admission import admit_ticket
from .models import Ticket, TicketEvent, TicketState
from .selectors import get_visible_ticket

log = logging.getLogger(__name__)

RETRYABLE = frozenset({TicketState.FAILED, TicketState.CANCELLED, TicketState.ORPHANED})
REASON_CHARS = limits.NOTE_CHARS


def check_budget(budget_s: Any, endpoint: Any) -> int | None:
    """A per-ticket budget is whole seconds, at least 1 and at most the
    endpoint's ``turn_budget_s`` (an owner's cap a retry may only lower)."""
    if budget_s is None or budget_s == "":
        return None
    if isinstance(budget_s, bool) or not isinstance(budget_s, int):
        raise Invalid("budget_s must be a whole number of seconds")
    cap = endpoint.turn_budget_s
    if not 1 <= budget_s <= cap:
        raise Invalid(f"budget_s must be 1 to {cap:g} seconds (the budget of {endpoint.address})")
    return budget_s


def retry_ticket(
    *,
    ticket_id: uuid.UUID | str,
    user: AbstractBaseUser,
    reason: str,
    input: dict[str, Any] | None = None,  # noqa: A002 - the contract's name
    budget_s: int | None = None,
) -> Ticket:
    """Admit a retry of a failed, cancelled or orphaned ticket.

    1. The ticket must be visible to ``user`` (404 otherwise, as for an
       unknown id); only an owner of its endpoint (staff included) or its
       submitter may retry it (403); a reason is required (400).
    2. Lock the original; it must be ``failed``, ``cancelled`` or
       ``orphaned`` (409 ``invalid_transition`` naming its state), not a
       callback ticket (its source's callback is what reports it), and not
       retried already (409, naming the retry).
    3. Admit the new ticket through admission (which refuses a quarantined
       endpoint with 423, a busy ``reject`` endpoint with 409, a full trace
       with 429): same endpoint, trace and parent, same requester (a root's
       retry owes the requester its result), the given input or the
       original's, no return_to (a child's parent already had its callback).
    4. In the same transaction, record ``retry_of`` and ``budget_s`` on the
       new ticket and a ``retried`` event on the original; the dispatcher is
       woken at commit, so the turn sees the budget.
    """
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("a reason is required: it is recorded on both tickets' timelines")
    if len(reason) > REASON_CHARS:
        raise Invalid(f"the reason is at most {REASON_CHARS} characters")
    original = get_visible_ticket(ticket_id, user=user)
    is_submitter = original.submitted_by_id is not None and original.submitted_by_id == user.pk
    if not (is_submitter or is_owner(user, original.endpoint)):
        raise Forbidden(
            f"only an owner of {original.endpoint.address} or the ticket's submitter may retry it"
        )
    if input is not None and not isinstance(input, dict):
        raise Invalid("input must be a JSON object")
    budget_s = check_budget(budget_s, original.endpoint)
    actor = f"user:{user.get_username()}"

    try:
        with transaction.atomic():
            locked = Ticket.objects.select_for_update(no_key=True).get(id=original.id)
            _check_retryable(locked)
            admitted = admit_ticket(
                endpoint=original.endpoint.address,
                input=locked.input if input is None else input,
                parent_id=locked.parent_id,
                trace_id=None if locked.parent_id else locked.trace_id,
                requester=locked.requester,
                submitted_by_id=locked.submitted_by_id,
                # The submitter asking is checked as one (may they still
                # submit?); an owner retries on the submitter's behalf.
                submitter=user if is_submitter else None,
                actor=actor,
            )
            retry = admitted.ticket
            lifecycle.update_fields(
                ticket_id=retry.id,
                kind="retry_of",
                actor=actor,
                detail={"retry_of": str(locked.id), "reason": reason, "budget_s": budget_s},
                retry_of_id=locked.id,
                budget_s=budget_s,
            )
            lifecycle.append_event(
                ticket_id=locked.id,
                kind="retried",
                actor=actor,
                detail={"retry": str(retry.id), "reason": reason, "budget_s": budget_s},
            )
    except IntegrityError:
        # Lost a race with a concurrent retry of the same ticket: the
        # constraint decided, and nothing of this attempt was committed.
        winner = Ticket.objects.filter(retry_of_id=original.id).values_list("id", flat=True).first()
        if winner is None:
            raise
        raise InvalidTransition(
            f"ticket {original.id} was already retried as {winner}", state=original.state
        ) from None
    log.info(
        "ticket retried",
        extra={"ticket": str(original.id), "retry": str(retry.id), "actor": actor},
    )
    return Ticket.objects.select_related("endpoint").get(id=retry.id)


def _check_retryable(ticket: Ticket) -> None:
    if ticket.state == TicketState.RECOVERING:
        # Its turn's end (or what its side-effecting calls did) is unknown:
        # only the case's owner may have it run again (authorize_rerun).
        case = _open_case(ticket)
        raise InvalidTransition(
            f"ticket {ticket.id} is recovering: recovery case {case} is open for it, and only "
            "an owner's decision on that case (authorize_rerun) may run it again",
            state=ticket.state,
            case=case,
        )
    if ticket.state not in RETRYABLE:
        raise InvalidTransition(
            f"ticket {ticket.id} is {ticket.state}: only a failed, cancelled or orphaned "
            "ticket is retried",
            state=ticket.state,
        )
    if ticket.callback_for_id is not None:
        raise InvalidTransition(
            f"ticket {ticket.id} is a callback: it reports {ticket.callback_for_id}, and is "
            "not retried on its own",
            state=ticket.state,
        )
    retry = Ticket.objects.filter(retry_of_id=ticket.id).values_list("id", flat=True).first()
    if retry is not None:
        raise InvalidTransition(
            f"ticket {ticket.id} was already retried as {retry}: retry that one instead",
            state=ticket.state,
        )


def _open_case(ticket: Ticket) -> str | None:
    """The case the quarantine of this ticket's turn opened (its
    ``endpoint_quarantined`` event names it: the tickets app does not read
    recovery's tables)."""
    detail = (
        TicketEvent.objects.filter(ticket_id=ticket.id, kind="endpoint_quarantined")
        .order_by("-id")
        .values_list("detail", flat=True)
        .first()
    )
    return (detail or {}).get("case")
