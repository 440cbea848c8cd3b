"""The dispatcher: publishes the turns the ledger owes (docs/explanation/design.md, flow 2).

Admission never talks to the broker. Its statement marks the new ticket
``needs_dispatch`` and, once it commits, the admitting process NOTIFYs
(core/wakes.py: never inside the write transaction); this thread
LISTENs on that channel and, on every wake-up, runs one pass of
``turns.dispatch_owed`` (one statement, prepared on the listening session,
then one batch of publishes).
Without a notification it still makes a pass every ``DISPATCHER_POLL_S``
(a notification sent while its LISTEN connection was down), and the lost-dispatch
sweep stays the safety net for a message the broker loses.

It runs as a thread of every Celery worker that consumes the ``control``
queue (``runtime/tasks.py`` starts it when the worker is ready): the
process every deployment already runs, with the database and broker settings
it needs. More than one at a time is safe: a pass locks the free endpoints'
lock rows and unmarks a ticket only if it is still marked.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connections

from core.dispatch import DISPATCH_CHANNEL
from core.listen import connect_listener, describe_target, listen_params
from core.transient import is_transient, warn_transient

from . import turns

log = logging.getLogger(__name__)


class Dispatcher(threading.Thread):
    def __init__(self, name: str = "dispatcher") -> None:
        super().__init__(name=name, daemon=True)
        self._stop_event = threading.Event()
        self.listening = threading.Event()  # set once LISTEN is in place
        self.rounds = 0  # passes made
        self.passes = 0  # passes that published something
        self.last_began = 0.0  # when the last pass began (monotonic)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    self._serve()
                except Exception as exc:  # a database outage: back off, then listen again
                    if is_transient(exc):
                        warn_transient(log, "dispatcher: pass failed; retrying", exc)
                    else:
                        log.exception("dispatcher: pass failed; retrying")
                    connections.close_all()
                    self._stop_event.wait(1.0)
        finally:
            connections.close_all()

    def _listener(self):
        # Its own session, direct or session-pooled (DATABASE_LISTEN_URL):
        # through a transaction pooler no notification would reach it.
        listener = connect_listener(listen_params("claimcheck dispatcher"))
        listener.execute(f"LISTEN {DISPATCH_CHANNEL}")
        return listener

    def _serve(self) -> None:
        listener = self._listener()
        try:
            self.listening.set()
            while not self._stop_event.is_set():
                # LISTEN is in place before the pass: a ticket committed
                # during the pass wakes the next one.
                close_old_connections()
                began = time.monotonic()
                self.last_began = began
                self.rounds += 1
                # On the listening session: see turns.dispatch_owed. A
                # notification that arrives while the statement runs waits in
                # psycopg's backlog for the next notifies().
                if turns.dispatch_owed(session=listener):
                    self.passes += 1
                self._wait(listener, not_before=began + settings.DISPATCHER_MIN_GAP_S)
        finally:
            listener.close()

    def _wait(self, listener, *, not_before: float) -> None:
        """Until the next pass: the first notification (or the poll period),
        but not before ``not_before`` (``DISPATCHER_MIN_GAP_S`` after the
        last pass began), then what else arrived is drained: one pass serves
        them all. A burst of admissions (each one notifies) costs a pass per
        gap, not one each (every pass is a statement over the queued
        endpoints); the first admission after a quiet spell is
        served at once. Short slices so that stop() is seen promptly."""
        poll = settings.DISPATCHER_POLL_S
        waited = 0.0
        while waited < poll and not self._stop_event.is_set():
            step = min(0.5, poll - waited)
            if any(True for _ in listener.notifies(timeout=step, stop_after=1)):
                early = not_before - time.monotonic()
                if early > 0:
                    self._stop_event.wait(early)
                for _ in listener.notifies(timeout=0.0):
                    pass
                return
            waited += step


_running: Dispatcher | None = None


def start_in_worker(queues) -> Dispatcher | None:
    """Start the dispatcher in a worker that consumes the control or the turns
    queue: every worker dispatches (several dispatchers are safe), so turns
    still start while the control worker is down."""
    global _running
    if not settings.DISPATCHER_ENABLED or not {"control", "turns"} & set(queues):
        return None
    if _running is None or not _running.is_alive():
        _running = Dispatcher()
        _running.start()
        log.info("dispatcher started (LISTEN %s via %s)", DISPATCH_CHANNEL, describe_target())
    return _running


def stop_in_worker() -> None:
    global _running
    if _running is not None:
        _running.stop()
        _running.join(timeout=5)
        _running = None
