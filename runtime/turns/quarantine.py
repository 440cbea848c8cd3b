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
from tickets.models import TicketState, Turn, TurnState
from tickets.turns import quarantine as ledger

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
        turn = ledger.lock_turn_rows(turn)
        grace = timedelta(seconds=turn.endpoint.interrupt_grace_s)
        # The database stamped the interrupt request (budgets.request_interrupt):
        # its grace runs out on the same clock, whatever this host's says.
        with connection.cursor() as cur:
            cur.execute("SELECT statement_timestamp()")
            (db_now,) = cur.fetchone()
        if turn.state != TurnState.INTERRUPTING or turn.interrupt_requested_at + grace > db_now:
            return None
        ledger.mark_uncertain(turn_id=turn.id, expected=(TurnState.INTERRUPTING,))
        reason = (
            f"turn {turn.seq} ({turn.runner_kind} runner on {turn.worker.get('host')}:"
            f"{turn.worker.get('pid')}) was interrupted for {turn.interrupt_reason} at "
            f"{turn.interrupt_requested_at.isoformat()} and gave no stop evidence within "
            f"{turn.endpoint.interrupt_grace_s:g}s"
        )
        case_id = _quarantine(turn=turn, reason=reason, actor=actor, at=now)
    log.error("endpoint %s quarantined: %s (case %s)", turn.endpoint.address, reason, case_id)
    return case_id


def quarantine_side_effect_in_doubt(
    *,
    turn_id: uuid.UUID,
    seq: int,
    open_calls: list[dict[str, Any]],
    exit: dict[str, Any],  # noqa: A002 - the process's exit, as the runner saw it
    actor: str,
) -> uuid.UUID | None:
    """The turn's process ended without an outcome (it died, or the
    escalation killed it) while side-effecting tool calls had no end: the
    stop is proven, what the calls did is not. An owner decides, exactly as
    for a turn with no stop evidence: the turn ``uncertain``, the ticket
    ``recovering`` (so no retry can run the call again behind the owner's
    back), the endpoint ``quarantined`` and the case opened by the case
    keeper, in one transaction; the open calls (tool, call id, idempotency
    key) are in the case's reason and the ``turn_uncertain`` event. Only for
    this exact turn and ``seq`` while it is still running or interrupting;
    None otherwise (another ended or quarantined it first)."""
    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        return None
    now = timezone.now()
    with transaction.atomic():
        turn = ledger.lock_turn_rows(turn)
        if not ledger.mark_uncertain(
            turn_id=turn.id, seq=seq, expected=(TurnState.RUNNING, TurnState.INTERRUPTING)
        ):
            return None
        how = exit.get("signal") or f"exit code {exit.get('returncode')}"
        calls = "; ".join(
            f"{c.get('tool')} (call {c.get('call_id')}, idempotency key "
            f"{c.get('idempotency_key') or 'none'})"
            for c in open_calls[:MAX_CALLS_NAMED]
        )
        more = len(open_calls) - MAX_CALLS_NAMED
        reason = (
            f"turn {turn.seq} ({turn.runner_kind} runner on {turn.worker.get('host')}:"
            f"{turn.worker.get('pid')}): its process {exit.get('pid')} ended ({how}) without an "
            f"outcome while side-effecting tool calls had no end: {calls}"
            + (f" and {more} more" if more > 0 else "")
            + "; whether they took effect is unknown"
        )
        case_id = _quarantine(
            turn=turn,
            reason=reason,
            actor=actor,
            at=now,
            detail={"side_effect_in_doubt": open_calls, "process_exit": exit},
        )
    log.error("endpoint %s quarantined: %s (case %s)", turn.endpoint.address, reason, case_id)
    return case_id


# The open calls a case's reason names one by one (all are in the event).
MAX_CALLS_NAMED = 5


def _quarantine(
    *, turn: Turn, reason: str, actor: str, at: Any, detail: dict[str, Any] | None = None
) -> uuid.UUID:
    """The quarantine of a turn just made ``uncertain``, in the caller's
    transaction (which holds the ticket, the lock and the turn): the ticket
    ``running -> recovering``, the case opened by the case keeper, the
    endpoint ``quarantined`` naming it; the lock stays with the turn."""
    lifecycle.transition(
        ticket_id=turn.ticket_id,
        expected=TicketState.RUNNING,
        to=TicketState.RECOVERING,
        kind="turn_uncertain",
        actor=actor,
        turn_id=turn.id,
        detail={"reason": reason, **(detail or {})},
    )
    case_id = case_keeper().open_case_for_uncertain_turn(turn=turn, reason=reason, at=at)
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
    return case_id


def resolve_uncertain_turn(
    *, turn_id: uuid.UUID, resolution: str, actor: str, evidence: dict[str, Any] | None = None
) -> None:
    """Close an ``uncertain`` turn by an owner decision and let its endpoint
    leave quarantine, in the caller's transaction (the decision's).

    ``resolution`` is ``unresolved`` (finalize/rerun: nobody proved it
    stopped, the owner accepts the risk) or ``stopped`` (release: the owner
    gives evidence that it ended). The lock held by the turn is released and
    the endpoint's oldest queued ticket dispatched after commit. The
    turn's end and the lock's release are the ledger's
    (``tickets.turns.quarantine.end_uncertain``, which also refuses an
    unknown resolution before it writes anything).
    """
    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    with transaction.atomic():
        ledger.end_uncertain(turn=turn, resolution=resolution, actor=actor, evidence=evidence)
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
