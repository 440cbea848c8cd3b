"""Quarantine: a turn that gave no stop evidence becomes ``uncertain``, its
ticket ``recovering``, its endpoint ``quarantined``; and leaving quarantine
by a recovery decision."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core.errors import StaleTurn
from endpoints.models import Endpoint, EndpointState
from tickets import lifecycle
from tickets.models import Ticket, TicketState

from ..models import EndpointLock, Turn, TurnState
from ..ports import case_keeper
from .dispatch import dispatch_next

log = logging.getLogger(__name__)


def quarantine_turn(*, turn_id: uuid.UUID, actor: str = "sweeper") -> uuid.UUID | None:
    """No stop evidence within the grace period: the turn is ``uncertain``,
    its ticket ``recovering``, the endpoint ``quarantined`` (the lock stays
    with the uncertain turn) and a case is opened by the case keeper
    (``runtime/ports.py``) — one transaction. ``actor``: the budget sweep,
    or the worker that ran the turn (``budgets.BudgetWatch``).
    Returns the case id, or None if the turn stopped meanwhile (or its grace
    has not run out)."""
    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        return None
    now = timezone.now()
    with transaction.atomic():
        Ticket.objects.select_for_update().get(id=turn.ticket_id)
        EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
        turn = (
            Turn.objects.select_for_update(of=("self",)).select_related("endpoint").get(id=turn_id)
        )
        grace = timedelta(seconds=turn.endpoint.interrupt_grace_s)
        # The database stamped the interrupt request (budgets.request_interrupt):
        # its grace runs out on the same clock, whatever this host's says.
        with connection.cursor() as cur:
            cur.execute("SELECT statement_timestamp()")
            (db_now,) = cur.fetchone()
        if turn.state != TurnState.INTERRUPTING or turn.interrupt_requested_at + grace > db_now:
            return None
        Turn.objects.filter(id=turn.id).update(state=TurnState.UNCERTAIN)
        reason = (
            f"turn {turn.seq} ({turn.runner_kind} runner on {turn.worker.get('host')}:"
            f"{turn.worker.get('pid')}) was interrupted for {turn.interrupt_reason} at "
            f"{turn.interrupt_requested_at.isoformat()} and gave no stop evidence within "
            f"{turn.endpoint.interrupt_grace_s:g}s"
        )
        lifecycle.transition(
            ticket_id=turn.ticket_id,
            expected=TicketState.RUNNING,
            to=TicketState.RECOVERING,
            kind="turn_uncertain",
            actor=actor,
            turn_id=turn.id,
            detail={"reason": reason},
        )
        case_id = case_keeper().open_case_for_uncertain_turn(turn=turn, reason=reason, at=now)
        Endpoint.objects.filter(id=turn.endpoint_id).update(
            state=EndpointState.QUARANTINED, quarantine_case=case_id
        )
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="endpoint_quarantined",
            actor=actor,
            turn_id=turn.id,
            detail={"case": str(case_id), "endpoint": turn.endpoint.address},
        )
    log.error("endpoint %s quarantined: %s (case %s)", turn.endpoint.address, reason, case_id)
    return case_id


def resolve_uncertain_turn(
    *, turn_id: uuid.UUID, resolution: str, actor: str, evidence: dict[str, Any] | None = None
) -> None:
    """Close an ``uncertain`` turn by an owner decision and let its endpoint
    leave quarantine, in the caller's transaction (the decision's).

    ``resolution`` is ``unresolved`` (finalize/rerun: nobody proved it
    stopped, the owner accepts the risk) or ``stopped`` (release: the owner
    gives evidence that it ended). The lock held by the turn is released and
    the endpoint's oldest queued ticket dispatched after commit.
    """
    if resolution not in (TurnState.UNRESOLVED, TurnState.STOPPED):
        raise ValueError(f"unknown resolution {resolution!r}")
    from core.errors import InvalidTransition

    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    with transaction.atomic():
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
        if not Turn.objects.filter(id=turn_id, state=TurnState.UNCERTAIN).update(**fields):
            raise InvalidTransition(f"turn {turn_id} is not uncertain", state=turn.state)
        EndpointLock.objects.filter(endpoint_id=turn.endpoint_id, holder_id=turn_id).update(
            holder=None, token=None, acquired_at=None
        )
        left = Endpoint.objects.filter(id=turn.endpoint_id, state=EndpointState.QUARANTINED).update(
            state=EndpointState.AVAILABLE, quarantine_case=None
        )
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="turn_resolved",
            actor=actor,
            turn_id=turn.id,
            detail={"resolution": resolution, "endpoint_released": bool(left)},
        )
        dispatch_next(endpoint_id=turn.endpoint_id)
