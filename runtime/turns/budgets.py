"""Interrupts, the worker's own enforcement of a turn's budget, and the
budget sweep: deadlines, lost heartbeats and interrupts whose grace has run
out (DESIGN.md flow 3; docs/explanation/design.md, "Budget")."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.transient import TRANSIENT_DB_ERRORS, describe, drop_broken_connection, retry_transient
from endpoints.models import Endpoint, RunnerKind
from tickets import budgets as trace_budgets
from tickets.models import TURN_ACTIVE_STATES, Turn, TurnState
from tickets.turns.interrupt import request_interrupt

from .. import runners
from .held import held, holding
from .quarantine import quarantine_turn
from .sweeplock import sweep_lock

log = logging.getLogger(__name__)


def cancel_http_turn(turn: Turn) -> None:
    """The runtime's step of an interrupt (tickets/turns/interrupt.py,
    registered by ``RuntimeConfig.ready``): an http agent is asked to stop
    through its cancel URL, after the interrupt commits. The worker's
    heartbeat sees the flag; a command's runner signals its process group."""
    if turn.runner_kind == RunnerKind.HTTP:
        runner, turn_id, seq = turn.endpoint.runner, turn.id, turn.seq
        transaction.on_commit(lambda: runners.cancel_http_turn(runner, turn_id, seq))


def supersede_turn(turn_id: uuid.UUID, seq: int, by: uuid.UUID) -> bool:
    """The ``interrupt`` busy policy (tickets/superseding.py): ticket ``by``,
    admitted while this exact turn ran, asks it to stop -- the budget's own
    path from here on (flag, grace, escalation, quarantine if unproven); its
    ticket fails ``superseded`` naming ``by``. False when the turn no longer
    runs with ``seq`` (it ended, or another ticket's request came first)."""
    return request_interrupt(
        turn_id=turn_id, seq=seq, reason="superseded", actor=f"ticket:{by}", detail={"by": str(by)}
    )


def interrupt_trace(trace_id: str) -> list[uuid.UUID]:
    """A trace spent its budget (tickets/budgets.py): each of its running
    turns is asked to stop through ``request_interrupt``, the same path as
    a deadline (cooperative flag, grace, escalation, then the sweep's
    quarantine if the stop is unproven). Returns the turns asked."""
    running = Turn.objects.filter(ticket__trace_id=trace_id, state=TurnState.RUNNING)
    asked = [
        turn_id
        for turn_id, seq in running.values_list("id", "seq")
        if request_interrupt(
            turn_id=turn_id, seq=seq, reason="trace_budget_exhausted", actor="budget"
        )
    ]
    if asked:
        log.warning(
            "trace %s is over its budget: %d running turns interrupted", trace_id, len(asked)
        )
    return asked


def sweep_trace_budgets() -> list[uuid.UUID]:
    """Traces past their wall-clock budget are closed, and every running
    turn of a closed trace is interrupted: also the ones whose interrupt
    after a charge's commit was lost with its process. Reads the running
    turns (a partial index), then which of their traces are closed."""
    trace_budgets.expire_wall_budgets()
    running = list(
        Turn.objects.filter(state=TurnState.RUNNING).values_list("id", "seq", "ticket__trace_id")
    )
    closed = trace_budgets.exhausted_of({trace for _, _, trace in running})
    return [
        turn_id
        for turn_id, seq, trace in running
        if trace in closed
        and request_interrupt(
            turn_id=turn_id, seq=seq, reason="trace_budget_exhausted", actor="budget"
        )
    ]


# Who asks when the worker running a turn enforces its budget itself.
WORKER_ACTOR = "worker:budget"


class BudgetWatch:
    """The budget of one turn, enforced by the worker process that runs it,
    with no sweep, control worker or beat involved (docs/explanation/design.md,
    "Budget").

    The worker's heartbeat thread calls ``step`` whenever ``due`` passes:

    1. At the deadline (the turn's budget timed from the worker's monotonic
       clock when its start returned: never before the ``deadline_at`` the
       database recorded, whatever the two hosts' clocks say), the runner's
       flag is raised and the interrupt of this exact turn and ``seq`` is
       requested through ``request_interrupt``, as the sweep requests it.
       The flag does not wait for the request (a database outage): the
       budget holds; the request is retried every ``RETRY_S`` until it is
       in the ledger, and the worker records it before it finishes a
       stopped outcome (``record_interrupt``), so the ticket fails as timed
       out.
    2. The runner's own escalation follows the flag (an isolated turn's
       supervisor: ``interrupt_grace_s``, SIGTERM, ``kill_after_s``, SIGKILL,
       ``waitpid``; a command's process group), and its outcome, with the
       stop evidence, is finished by the worker as any other.
    3. When the runner has not returned within the turn's stop window
       (``runners.stop_window_s``, the sweep's own) since the flag, nothing
       proves it stopped (an inline callable that ignores its flag):
       ``quarantine_turn``, as the sweep would.

    A flag raised by somebody else's request (the sweep, a cancel, the
    worker's shutdown) starts the same stop window (``noticed``). Every
    write is a conditional transition, so the sweep may act on the same turn
    at the same moment: one of them wins, the other changes nothing. Once
    ``runner_returned`` is called the watch does nothing more: the outcome
    is the worker's to finish."""

    RETRY_S = 1.0

    def __init__(
        self,
        *,
        turn: Turn,
        endpoint: Endpoint,
        interrupt: threading.Event,
        now: float | None = None,
    ) -> None:
        now = time.monotonic() if now is None else now
        self.turn, self.interrupt = turn, interrupt
        budget = (turn.deadline_at - turn.started_at).total_seconds()
        self.stop_window = runners.stop_window_s(
            endpoint.runner, endpoint.heartbeat_timeout_s, endpoint.interrupt_grace_s
        )
        self.deadline = now + budget
        self.due = self.deadline  # monotonic: when ``step`` has something to do
        self.flag_at: float | None = None  # when this worker raised (or saw) the flag
        self.recorded = False  # the turn's interrupt is in the ledger (ours or another's)
        self.settled = False  # quarantined, or found not interrupting any more
        self.returned = False
        self._lock = threading.Lock()

    # --- from the turn's own thread ---

    def runner_returned(self) -> None:
        """The runner returned: from now on the outcome decides, not the watch."""
        with self._lock:
            self.returned = True
            self.due = float("inf")

    def record_interrupt(self) -> None:
        """Before the finish of a stopped outcome: the interrupt this worker
        raised the flag for is in the ledger (retried through an outage),
        so the finish records why the turn stopped."""
        if self.flag_at is not None and not self.recorded:
            # The runner stopped: its stop evidence is held meanwhile.
            with held(self.turn.id, self.turn.seq, "stopped", None):
                retry_transient(
                    self._request,
                    what=f"interrupt of turn {self.turn.id}",
                    max_s=settings.FINISH_RETRY_MAX_S,
                )

    def quarantine_unproven(self) -> uuid.UUID | None:
        """The runner gave up without stop evidence (an isolated process that
        survived SIGKILL): quarantine now, without waiting for the sweep."""
        self.record_interrupt()

        def attempt() -> uuid.UUID | None:
            case = quarantine_turn(turn_id=self.turn.id, actor=WORKER_ACTOR)
            self.settled = case is not None or not self._interrupting()
            return case

        case = retry_transient(
            attempt, what=f"quarantine of turn {self.turn.id}", max_s=settings.FINISH_RETRY_MAX_S
        )
        if case is None and not self.settled:
            # Still interrupting, its grace not yet run out on the ledger's
            # clock (another host asked): the sweep's stop window ends it.
            log.warning(
                "turn %s gave no stop evidence; its quarantine is left to the budget sweep",
                self.turn.id,
            )
        return case

    # --- from the heartbeat thread ---

    def noticed(self, now: float) -> None:
        """The ledger says the turn is interrupting (the flag came with a beat)."""
        with self._lock:
            self.recorded = True
            if self.flag_at is None and not self.returned:
                self.flag_at = now
                self.due = min(self.due, now + self.stop_window)

    def step(self, now: float) -> None:
        """What is due now; never raises (it runs on the heartbeat thread)."""
        with self._lock:
            if self.returned or self.settled:
                self.due = float("inf")
                return
            if self.flag_at is None:
                self.flag_at = now
                log.warning(
                    "turn %s seq %s is past its budget: its worker interrupts it",
                    self.turn.id,
                    self.turn.seq,
                )
        # The flag first: the budget holds however long the ledger takes to
        # record the request (a stopped outcome waits for it: record_interrupt).
        self.interrupt.set()
        retry = False
        try:
            if not self.recorded:
                self._request()
            if now >= self.flag_at + self.stop_window:
                retry = not self._quarantine()
        except TRANSIENT_DB_ERRORS as exc:
            retry = True
            log.warning(
                "budget of turn %s seq %s: %s; retrying", self.turn.id, self.turn.seq, describe(exc)
            )
            drop_broken_connection()
        except Exception:  # the watch must not kill the heartbeat thread
            retry = True
            log.exception("budget of turn %s failed; retrying", self.turn.id)
            drop_broken_connection()
        with self._lock:
            if self.returned or self.settled:
                self.due = float("inf")
            elif retry or not self.recorded:
                self.due = now + self.RETRY_S
            else:
                self.due = max(self.flag_at + self.stop_window, now + self.RETRY_S)

    def _request(self) -> None:
        request_interrupt(
            turn_id=self.turn.id, seq=self.turn.seq, reason="deadline", actor=WORKER_ACTOR
        )
        # Ours, or the turn was no longer running (interrupted by another, or
        # ended): either way there is nothing more to ask.
        self.recorded = True

    def _quarantine(self) -> bool:
        """False: not yet (the ledger's grace, on the clock of whoever asked,
        has not run out): try again."""
        with self._lock:
            if self.returned:
                return True
        case = quarantine_turn(turn_id=self.turn.id, actor=WORKER_ACTOR)
        if case is not None or not self._interrupting():
            self.settled = True
            return True
        return False

    def _interrupting(self) -> bool:
        state = Turn.objects.filter(id=self.turn.id).values_list("state", flat=True).first()
        return state == TurnState.INTERRUPTING


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
    # Interrupting turns past their stop window whose outcome a live worker
    # holds (runtime/turns/held.py): their finish is on its way.
    held: list[uuid.UUID] = field(default_factory=list)


def _held_off(turn: Turn, now: datetime) -> bool:
    """Not quarantined yet: the worker that ran this exact turn is alive and
    holds its outcome (the runner returned: it stopped), and its finish waits
    for the database (behind a pooler, up to ``server_login_retry`` longer
    than the sweep's direct connection). For at most ``FINISH_RETRY_MAX_S``
    past the stop window, as long as the worker retries its finish; its
    finish is then judged as any late outcome (docs/explanation/design.md, "A late
    outcome")."""
    limit = timedelta(seconds=_stop_window(turn) + settings.FINISH_RETRY_MAX_S)
    if turn.interrupt_requested_at + limit <= now:
        return False
    announced = holding(turn.id, turn.seq)
    if announced is None:
        return False
    log.info(
        "turn %s seq %s: no quarantine, its worker %s:%s holds its %s outcome",
        turn.id,
        turn.seq,
        announced.get("host"),
        announced.get("pid"),
        announced.get("outcome"),
    )
    return True


def sweep_budgets() -> SweepReport:
    """Enforce time budgets (DESIGN.md flow 3).

    1. Take the sweep's advisory lock; a second sweeper skips this round.
    2. Running turns past ``deadline_at``, or whose heartbeat is older than
       their endpoint's ``heartbeat_timeout_s``: request an interrupt.
    3. Interrupting turns whose grace has run out with no stop evidence:
       quarantine -- unless a live worker holds the turn's outcome and
       retries its finish (``_held_off``).
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
                if _held_off(turn, now):
                    report.held.append(turn.id)
                    continue
                case = quarantine_turn(turn_id=turn.id)
                if case is not None:
                    report.quarantined.append(case)
    return report
