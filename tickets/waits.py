"""Waiting for a ticket to change or end, without polling the ledger.

Every ticket event NOTIFYs ``TICKET_CHANNEL`` with its ticket's id when its
transaction commits: ``lifecycle.append_event`` (``notify_changed``) and the
turn's start and finish statements, in the statement itself. An admission
does not: its statement already wakes the dispatcher (``DISPATCH_CHANNEL``),
and nobody can be waiting on a ticket before it exists, so that
notification stands for "a ticket was admitted". One listener thread per
web process holds the only LISTEN connection (both channels; it connects to
``DATABASE_LISTEN_URL`` when set: core/listen.py) and wakes the
requests waiting on that id, and those waiting on any change (``ANY``: the
console's lists and dashboard), which every notification of either channel
wakes. A waiting request reads once after it subscribed (so a change that
committed in between is not missed) and once after it wakes: it costs no
queries while it waits, and holds no database connection (it closes its
own, outside a transaction).

Two waits use it: ``wait_until_terminal`` (the API's ``wait_s``) and
``wait_for_change`` (the console's live regions, console/views/live.py).

While the listener is down (a database restart), a wait cannot wait: ``wait_s``
answers at once with the ticket as last read (reading it again would wait on
the database, or on a pooler that holds the read through the outage), and
``wait_for_change`` answers at once (the console polls instead).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict

from django.db import connection

from core.dispatch import DISPATCH_CHANNEL
from core.listen import connect_listener, listen_params
from core.wakes import wake

log = logging.getLogger(__name__)

TICKET_CHANNEL = "claimcheck_ticket"
# The listener's application_name (pg_stat_activity).
LISTENER_NAME = "claimcheck waits"
# The listener closes its connection after this long without a waiter (and
# opens it again for the next one): an idle web process holds no session.
IDLE_CLOSE_S = 2.0
# The key of a wait for any ticket's change.
ANY = "*"


class _Hub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._stopping = False
        self.generation = 0  # moves on at stop(): a waiter it woke reads nothing

    def subscribe(self, ticket_id: uuid.UUID | str) -> threading.Event | None:
        """An event set when an event of the ticket (or of any ticket, for
        ``ANY``) commits, or None when no listener is up (the caller polls)."""
        event = threading.Event()
        with self._lock:
            # Registered before the listener is checked, under the lock the
            # listener takes to close when idle: it cannot leave us behind.
            self._waiters[str(ticket_id)].add(event)
            if self._thread is None or not self._thread.is_alive():
                params = listen_params(LISTENER_NAME)  # DATABASE_LISTEN_URL, else DATABASE_URL
                self._thread = threading.Thread(
                    target=self._listen, args=(params,), name="ticket-waits", daemon=True
                )
                self._thread.start()
        if not self._listening.wait(1.0):
            self.unsubscribe(ticket_id, event)
            return None
        return event

    def listening(self) -> bool:
        return self._listening.is_set()

    def unsubscribe(self, ticket_id: uuid.UUID | str, event: threading.Event | None) -> None:
        if event is None:
            return
        with self._lock:
            waiting = self._waiters.get(str(ticket_id))
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[str(ticket_id)]

    def _wake(self, key: str | None) -> None:
        with self._lock:
            if key is None:  # the listener lost its connection: everyone re-reads
                events = [e for waiting in self._waiters.values() for e in waiting]
            else:
                events = list(self._waiters.get(ANY, ()))
                if key != ANY:
                    events += self._waiters.get(key, ())
        for event in events:
            event.set()

    def stop(self) -> None:
        """Close the listener (tests; a process that shuts down). Waiters
        wake and return without reading: the database may be going away."""
        self._stopping = True
        self.generation += 1
        self._wake(None)
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        self._stopping = False

    def _listen(self, params: dict) -> None:
        while not self._stopping:
            try:
                with connect_listener(params) as conn:
                    conn.execute(f"LISTEN {TICKET_CHANNEL}")
                    conn.execute(f"LISTEN {DISPATCH_CHANNEL}")
                    self._listening.set()
                    idle_since = None
                    while not self._stopping:
                        for note in conn.notifies(timeout=0.5):
                            # An admission (or a release) wakes the dispatcher:
                            # some ticket changed, whose id it does not say.
                            self._wake(note.payload if note.channel == TICKET_CHANNEL else ANY)
                        with self._lock:
                            waiting = bool(self._waiters)
                        if waiting:
                            idle_since = None
                        elif idle_since is None:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since > IDLE_CLOSE_S or self._stopping:
                            with self._lock:  # no subscribe can slip in while we leave
                                if not self._waiters:
                                    self._listening.clear()
                                    self._thread = None
                                    return
            except Exception:  # a database restart: waiters poll until we are back
                log.warning("ticket waits: listener lost its connection; reconnecting")
            self._listening.clear()
            self._wake(None)
            time.sleep(1.0)


_hub = _Hub()


def wait_until_terminal(ticket, wait_s: float, load, is_terminal):
    """Return the ticket (``load(id)``, a fresh read) once ``is_terminal``
    holds of it or ``wait_s`` has passed; ``ticket`` is the caller's read.
    With no listener (the database away), at once with the last read."""
    deadline = time.monotonic() + wait_s
    ticket_id = ticket.id
    if is_terminal(ticket):
        return ticket
    event = _hub.subscribe(ticket_id)
    if event is None:
        return ticket
    try:
        while True:
            event.clear()  # before the read: a change after it sets it again
            ticket = load(ticket_id)  # after subscribing: nothing slips between
            left = deadline - time.monotonic()
            if is_terminal(ticket) or left <= 0:
                return ticket
            # Hold no database session while waiting: a hundred waiters
            # would otherwise pin a hundred connections (PostgreSQL's
            # default max_connections is 100). One reconnect on waking.
            if not connection.in_atomic_block:
                connection.close()
            if not event.wait(left):
                return load(ticket_id)
            if not _hub.listening():
                return ticket  # woken by the listener's loss: the database is away
    finally:
        _hub.unsubscribe(ticket_id, event)


def wait_for_change(key: str, token: str, read_token, wait_s: float) -> tuple[str, bool] | None:
    """Wait up to ``wait_s`` for ``read_token()`` to differ from ``token``,
    woken by the events of ticket ``key`` (or of any ticket: ``ANY``).
    Returns ``(current token, changed)``, or None when no listener is up
    (a database restart): the caller polls instead."""
    event = _hub.subscribe(key)
    if event is None:
        return None
    generation = _hub.generation
    try:
        current = read_token()  # after subscribing: nothing slips between
        if current != token:
            return current, True
        if not connection.in_atomic_block:
            connection.close()  # no session held while waiting
        if not event.wait(wait_s) or _hub.generation != generation:
            return token, False  # nothing happened (or the process stops): no read
        current = read_token()
        return current, current != token
    finally:
        _hub.unsubscribe(key, event)


def stop_listener() -> None:
    _hub.stop()


def notify_changed(ticket_id: uuid.UUID) -> None:
    """Wake the watchers of ``ticket_id`` once the current transaction
    commits, from outside it (core/wakes.py)."""
    wake(TICKET_CHANNEL, str(ticket_id))
