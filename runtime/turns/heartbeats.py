"""Liveness of a running turn: the heartbeat service and the worker's
heartbeat thread that also raises the runner's interrupt flag and wakes
for the turn's budget."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from django.db import connection, transaction
from django.utils import timezone

from core.errors import StaleTurn
from core.transient import (
    TRANSIENT_DB_ERRORS,
    backoff_delay,
    describe,
    drop_broken_connection,
)
from tickets.models import TURN_ACTIVE_STATES, Turn, TurnState

from .evidence import record_stale

log = logging.getLogger(__name__)


class Watch(Protocol):
    """What the heartbeat thread drives besides the beats: the turn's budget
    (``budgets.BudgetWatch``, a layer above this module)."""

    due: float  # monotonic; inf when nothing is left to do

    def noticed(self, now: float) -> None: ...

    def step(self, now: float) -> None: ...


@dataclass
class HeartbeatState:
    current: bool
    interrupted: bool


def heartbeat(
    *, turn_id: uuid.UUID, seq: int, source: str = "worker", strict: bool = False
) -> HeartbeatState:
    """Record liveness of an active exact turn. A heartbeat for a turn that is
    not active (ended, uncertain) or with another ``seq`` changes nothing: it
    is evidence only, and with ``strict`` raises ``StaleTurn``."""
    now = timezone.now()
    updated = Turn.objects.filter(id=turn_id, seq=seq, state__in=TURN_ACTIVE_STATES).update(
        heartbeat_at=now
    )
    state = Turn.objects.filter(id=turn_id).values_list("state", flat=True).first()
    if updated:
        return HeartbeatState(current=True, interrupted=state == TurnState.INTERRUPTING)
    if strict:
        with transaction.atomic():
            turn = Turn.objects.filter(id=turn_id).first()
            if turn is not None:
                record_stale(turn=turn, seq=seq, kind="heartbeat", source=source, detail={})
        raise StaleTurn(
            f"turn {turn_id} with seq {seq} is not the current exact turn (state {state})",
            state=state,
        )
    return HeartbeatState(current=False, interrupted=True)


class Heartbeater:
    """The heartbeat of one turn running in this worker process. It also
    raises the runner's interrupt flag when the turn is asked to stop
    (cooperative interrupt).

    Its scheduled beats are made by the process's one heartbeat thread
    (``_HeartbeatThread``): a turn costs a dict entry, not a thread started and
    joined, a visible share of a short turn's cost in the worker.

    It outlives a database outage: a failed beat drops the thread's broken
    connection and the next one is tried sooner (capped backoff), so once the
    database is back the turn's heartbeat is fresh again within a couple of
    seconds. It keeps beating until the turn's outcome is recorded (``stop``
    after the finish), so a finish that waits out an outage is never taken
    for a dead worker."""

    RETRY_CAP_S = 2.0

    def __init__(
        self,
        turn: Turn,
        interval: float,
        interrupt: threading.Event,
        watch: Watch | None = None,
    ) -> None:
        self.turn, self.interval, self.interrupt = turn, interval, interrupt
        # The turn's budget, enforced by this process (budgets.BudgetWatch):
        # the same thread wakes for it.
        self.watch = watch
        self.failures = 0
        self.due = 0.0  # monotonic time of the next scheduled beat

    def _beat(self) -> bool:
        state = heartbeat(turn_id=self.turn.id, seq=self.turn.seq)
        if state.interrupted:
            self.interrupt.set()
            if self.watch is not None:
                self.watch.noticed(time.monotonic())
                _thread().reschedule()
        return state.interrupted

    def next_due(self) -> float:
        """When the heartbeat thread has something to do for this turn next."""
        if self.watch is None:
            return self.due
        return min(self.due, self.watch.due)

    def run_due(self, now: float) -> None:
        """The beat and the budget step that are due at ``now``; never raises."""
        if self.due <= now:
            self.scheduled_beat()
        if self.watch is not None and self.watch.due <= now:
            self.watch.step(time.monotonic())

    def beat(self) -> bool:
        """The runner's ``ctx.heartbeat()``: a database blip must not fail
        the runner, so a transient error answers with what is known."""
        try:
            return self._beat()
        except TRANSIENT_DB_ERRORS as exc:
            log.warning(
                "heartbeat for turn %s seq %s from the runner failed: %s",
                self.turn.id,
                self.turn.seq,
                describe(exc),
            )
            drop_broken_connection()
            return self.interrupt.is_set()

    def _next_wait(self) -> float:
        if not self.failures:
            return self.interval
        return backoff_delay(
            self.failures - 1, base_s=0.25, cap_s=min(self.interval, self.RETRY_CAP_S)
        )

    def scheduled_beat(self) -> None:
        """A beat from the heartbeat thread; never raises. Sets ``due``."""
        try:
            self._beat()
            if self.failures:
                log.info(
                    "heartbeat for turn %s is back after %d failure(s)",
                    self.turn.id,
                    self.failures,
                )
            self.failures = 0
        except TRANSIENT_DB_ERRORS as exc:
            self.failures += 1
            log.warning(
                "heartbeat for turn %s seq %s failed (%d): %s; retrying",
                self.turn.id,
                self.turn.seq,
                self.failures,
                describe(exc),
            )
            drop_broken_connection()
        except Exception:  # nothing may kill the heartbeat of a live turn
            self.failures += 1
            log.exception("heartbeat for turn %s failed", self.turn.id)
            drop_broken_connection()
        self.due = time.monotonic() + self._next_wait()

    def start(self) -> None:
        """Beat every ``interval`` from now until ``stop``."""
        self.due = time.monotonic() + self._next_wait()
        _thread().add(self)

    def stop(self) -> None:
        """No scheduled beat after this returns, except one already under
        way (harmless: a beat of an ended turn changes nothing)."""
        _thread().remove(self)


class _HeartbeatThread(threading.Thread):
    """The one heartbeat thread of a worker process: it sleeps until the
    earliest due beat of the turns the process runs, makes the due ones (on
    its own database connection, outside any lock) and sleeps again. With no
    turn left it closes its connection, as the thread per turn did when it
    ended: an idle pool process holds no extra database session."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="heartbeats")
        self._cond = threading.Condition()
        self._beats: dict[uuid.UUID, Heartbeater] = {}
        self._wake_at = float("inf")  # when the thread wakes next, as it knows
        self._connected = False  # it beat since it last closed its connection

    def add(self, beater: Heartbeater) -> None:
        with self._cond:
            self._beats[beater.turn.id] = beater
            # Wake the thread only when this beat is due before it would wake
            # anyway (back-to-back short turns then cost no thread switch).
            if beater.next_due() < self._wake_at:
                self._cond.notify()

    def reschedule(self) -> None:
        """A turn's budget step moved earlier (its interrupt was noticed)."""
        with self._cond:
            self._cond.notify()

    def remove(self, beater: Heartbeater) -> None:
        with self._cond:
            if self._beats.get(beater.turn.id) is beater:
                del self._beats[beater.turn.id]
            if not self._beats and self._connected:
                self._cond.notify()  # close the connection now, not at the next wake

    def run(self) -> None:
        # Process-directed signals (the worker's SIGTERM) must reach the main
        # thread: an idle pool process waits for its next job in the pool's
        # queue lock, and only a signal delivered to the main thread wakes
        # that wait. Delivered here, it would leave the process stuck at a
        # warm shutdown (seen under load on the embedded broker).
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self._cond:
                now = time.monotonic()
                due = [b for b in self._beats.values() if b.next_due() <= now]
                if not due:
                    idle = not self._beats
                    self._wake_at = (
                        min(b.next_due() for b in self._beats.values())
                        if self._beats
                        else float("inf")
                    )
                    if not (idle and self._connected):
                        self._cond.wait(None if idle else self._wake_at - now)
                        continue
            if not due:  # idle, with a connection open: close it (outside the lock)
                connection.close()
                self._connected = False
                continue
            for beater in due:
                self._connected = True
                beater.run_due(now)


_heartbeat_thread: _HeartbeatThread | None = None
_heartbeat_pid = 0
_heartbeat_lock = threading.Lock()


def _thread() -> _HeartbeatThread:
    """This process's heartbeat thread, started on first use (a forked pool
    process does not inherit its parent's thread: it starts its own)."""
    global _heartbeat_thread, _heartbeat_pid
    with _heartbeat_lock:
        if (
            _heartbeat_thread is None
            or _heartbeat_pid != os.getpid()
            or not _heartbeat_thread.is_alive()
        ):
            _heartbeat_thread = _HeartbeatThread()
            _heartbeat_thread.start()
            _heartbeat_pid = os.getpid()
        return _heartbeat_thread
