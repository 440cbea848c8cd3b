"""Interrupts and the budget sweep: deadlines, lost heartbeats and
interrupts whose grace has run out (DESIGN.md flow 3)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tickets import lifecycle

from .. import runners
from ..models import (
    TURN_ACTIVE_STATES,
    RunnerKind,
    Turn,
    TurnState,
)
from .quarantine import quarantine_turn
from .sweeplock import sweep_lock

log = logging.getLogger(__name__)


def request_interrupt(*, turn_id: uuid.UUID | None, reason: str, actor: str) -> bool:
    """``running -> interrupting`` for one exact turn; the worker's heartbeat
    sees the flag, a command's process group is signalled by its runner, an
    http agent is asked through its cancel URL (after commit). Returns False
    when the turn was not running (another sweeper got there first)."""
    if turn_id is None:
        return False
    now = timezone.now()
    with transaction.atomic():
        updated = Turn.objects.filter(id=turn_id, state=TurnState.RUNNING).update(
            state=TurnState.INTERRUPTING, interrupt_requested_at=now, interrupt_reason=reason
        )
        if not updated:
            return False
        turn = Turn.objects.select_related("endpoint").get(id=turn_id)
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="interrupt_requested",
            actor=actor,
            turn_id=turn.id,
            detail={"seq": turn.seq, "reason": reason, "grace_s": turn.endpoint.interrupt_grace_s},
        )
        if turn.runner_kind == RunnerKind.HTTP:
            runner, seq = turn.endpoint.runner, turn.seq
            transaction.on_commit(lambda: runners.cancel_http_turn(runner, turn_id, seq))
    log.warning("interrupt requested for turn %s (%s)", turn_id, reason)
    return True


def _stop_window(turn: Turn) -> float:
    """The grace, and for a process-isolated python turn the escalation
    after it (``runners.stop_window_s``): the supervisor's ``waitpid`` is
    the evidence, so the sweep waits for it before it quarantines."""
    ep = turn.endpoint
    return runners.stop_window_s(ep.runner, ep.heartbeat_timeout_s, ep.interrupt_grace_s)


@dataclass
class SweepReport:
    interrupted: list[uuid.UUID]
    quarantined: list[uuid.UUID]
    skipped: bool = False


def sweep_budgets() -> SweepReport:
    """Enforce time budgets (DESIGN.md flow 3).

    1. Take the sweep's advisory lock; a second sweeper skips this round.
    2. Running turns past ``deadline_at``, or whose heartbeat is older than
       their endpoint's ``heartbeat_timeout_s``: request an interrupt.
    3. Interrupting turns whose grace has run out with no stop evidence:
       quarantine.
    Each transition is its own conditional transaction, so even without the
    advisory lock two sweepers could not both act on one turn. The query
    reads only active turns (a partial index): the cost follows the number of
    running turns, not the size of the ledger.
    """
    report = SweepReport(interrupted=[], quarantined=[])
    with sweep_lock("budgets") as mine:
        if not mine:
            report.skipped = True
            return report
        now = timezone.now()
        active = list(Turn.objects.filter(state__in=TURN_ACTIVE_STATES).select_related("endpoint"))
        for turn in active:
            if turn.state == TurnState.RUNNING:
                hb_limit = timedelta(seconds=turn.endpoint.heartbeat_timeout_s)
                reason = (
                    "deadline"
                    if turn.deadline_at <= now
                    else "heartbeat"
                    if turn.heartbeat_at + hb_limit <= now
                    else None
                )
                if reason and request_interrupt(turn_id=turn.id, reason=reason, actor="sweeper"):
                    report.interrupted.append(turn.id)
            elif turn.interrupt_requested_at + timedelta(seconds=_stop_window(turn)) <= now:
                case = quarantine_turn(turn_id=turn.id)
                if case is not None:
                    report.quarantined.append(case)
    return report
