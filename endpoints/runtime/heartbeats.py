"""Liveness of a running turn: the heartbeat service and the worker's
heartbeat thread that also raises the runner's interrupt flag."""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from config.errors import StaleTurn
from config.transient import (
    TRANSIENT_DB_ERRORS,
    backoff_delay,
    describe,
    drop_broken_connection,
)

from ..models import (
    TURN_ACTIVE_STATES,
    Turn,
    TurnState,
)
from .evidence import record_stale

log = logging.getLogger(__name__)


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


class Heartbeater(threading.Thread):
    """Heartbeats for a turn running in this worker, and raises the runner's
    interrupt flag when the turn is asked to stop (cooperative interrupt).

    It outlives a database outage: a failed beat drops this thread's broken
    connection and the next one is tried sooner (capped backoff), so once the
    database is back the turn's heartbeat is fresh again within a couple of
    seconds. It keeps beating until the turn's outcome is recorded (``stop``
    after the finish), so a finish that waits out an outage is never taken
    for a dead worker."""

    RETRY_CAP_S = 2.0

    def __init__(self, turn: Turn, interval: float, interrupt: threading.Event) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{turn.id}")
        self.turn, self.interval, self.interrupt = turn, interval, interrupt
        self.done = threading.Event()

    def _beat(self) -> bool:
        state = heartbeat(turn_id=self.turn.id, seq=self.turn.seq)
        if state.interrupted:
            self.interrupt.set()
        return state.interrupted

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

    def _next_wait(self, failures: int) -> float:
        if not failures:
            return self.interval
        return backoff_delay(failures - 1, base_s=0.25, cap_s=min(self.interval, self.RETRY_CAP_S))

    def run(self) -> None:
        failures = 0
        try:
            while not self.done.wait(self._next_wait(failures)):
                try:
                    self._beat()
                    if failures:
                        log.info(
                            "heartbeat for turn %s is back after %d failure(s)",
                            self.turn.id,
                            failures,
                        )
                    failures = 0
                except TRANSIENT_DB_ERRORS as exc:
                    failures += 1
                    log.warning(
                        "heartbeat for turn %s seq %s failed (%d): %s; retrying",
                        self.turn.id,
                        self.turn.seq,
                        failures,
                        describe(exc),
                    )
                    drop_broken_connection()
                except Exception:  # nothing may kill the heartbeat of a live turn
                    failures += 1
                    log.exception("heartbeat for turn %s failed", self.turn.id)
                    drop_broken_connection()
        finally:
            connection.close()

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
