"""A turn whose stop is not proven, and its end by an owner's decision: the
ledger's records of both, in the caller's transaction.

``running | interrupting -> uncertain`` keeps the endpoint's lock with the
turn (nothing may run on the endpoint until an owner decides);
``uncertain -> unresolved | stopped`` ends the turn and frees the lock it
holds. Why a turn is uncertain (the reason text), the case, the ticket's
``recovering``, the endpoint's quarantine, their events and the next
dispatch are the runtime's (runtime/turns/quarantine.py)."""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from core.errors import InvalidTransition

from ..models import EndpointLock, Ticket, Turn, TurnState

# How an owner's decision ends an uncertain turn: ``unresolved`` (nobody
# proved it stopped, the owner accepts the risk) or ``stopped`` (the owner
# gives evidence that it ended).
RESOLUTIONS = (TurnState.UNRESOLVED, TurnState.STOPPED)


def lock_turn_rows(turn: Turn) -> Turn:
    """Lock ticket, lock row and turn, in the order every path that takes
    more than one of them takes them (the finish's); the turn as locked,
    with its endpoint. In the caller's transaction."""
    Ticket.objects.select_for_update().get(id=turn.ticket_id)
    EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
    return Turn.objects.select_for_update(of=("self",)).select_related("endpoint").get(id=turn.id)


def mark_uncertain(
    *, turn_id: uuid.UUID, expected: tuple[str, ...], seq: int | None = None
) -> bool:
    """``expected -> uncertain`` for one exact turn (and, given ``seq``, only
    while it carries that fencing token); the lock stays with it. In the
    caller's transaction, which holds the rows (``lock_turn_rows``). Returns
    False when the turn was in none of the ``expected`` states."""
    exact = {"seq": seq} if seq is not None else {}
    return bool(
        Turn.objects.filter(id=turn_id, state__in=expected, **exact).update(
            state=TurnState.UNCERTAIN
        )
    )


def end_uncertain(
    *, turn: Turn, resolution: str, actor: str, evidence: dict[str, Any] | None = None
) -> None:
    """``uncertain -> resolution`` (one of ``RESOLUTIONS``) for ``turn``, with
    the owner's ``evidence`` as its stop evidence when given, and the lock
    it holds freed; ticket and lock row locked first, in the caller's
    transaction. Raises InvalidTransition when the turn is not uncertain."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}")
    Ticket.objects.select_for_update().get(id=turn.ticket_id)
    EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
    now = timezone.now()
    fields: dict[str, Any] = {"state": resolution, "ended_at": now}
    if evidence is not None:
        fields["stop_evidence"] = {
            "kind": "owner_evidence",
            "observed_at": now.isoformat(),
            "seq": turn.seq,
            "detail": evidence,
            "actor": actor,
        }
    if not Turn.objects.filter(id=turn.id, state=TurnState.UNCERTAIN).update(**fields):
        raise InvalidTransition(f"turn {turn.id} is not uncertain", state=turn.state)
    EndpointLock.objects.filter(endpoint_id=turn.endpoint_id, holder_id=turn.id).update(
        holder=None, token=None, acquired_at=None
    )
