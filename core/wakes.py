"""Wake-ups after commit: the NOTIFY that tells a listener something changed,
sent outside the write transaction that changed it.

Why not in the transaction: PostgreSQL serialises the commits of notifying
transactions cluster-wide (``PreCommit_Notify`` holds one lock from the
notification queue's append until the commit record is flushed), so
notifying write transactions cannot share a WAL flush and admissions stop
scaling with clients at a few thousand a second (docs/explanation/scale.md). A
transaction that only notifies writes no WAL and holds that lock for
microseconds.

So a service calls ``wake(channel, payload)`` where it used to notify: the
wake is queued once the transaction commits (at once in autocommit) and a
thread of this process sends what is queued, many wakes in one statement,
on a connection of its own. The request or turn that woke never waits for
it. A wake is a hint, never the truth: the ledger row is, and every
listener is backed by a sweep (the dispatcher's poll, ``wait_s``'s
fallback read, the console's polling), so a wake lost to a crash or an
outage costs latency, never a ticket.

The waker connects like the rest of the process (``DATABASE_URL``: behind
PgBouncer in transaction mode each statement is its own transaction, which
is all a NOTIFY needs); the listeners connect to ``DATABASE_LISTEN_URL``
(core/listen.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from typing import Any

from django.db import connection, transaction

log = logging.getLogger(__name__)

# Every wake queued in one statement: unnest pairs each channel with its
# payload, and PostgreSQL folds repeats of one (channel, payload) into one.
_NOTIFY_SQL = "SELECT count(pg_notify(c, p)) FROM unnest(%s::text[], %s::text[]) AS w(c, p)"
# The waker gives up connecting or sending after this long: its wakes are
# dropped (the sweeps serve them) and it tries again with the next ones.
CONNECT_TIMEOUT_S = 3
# The session is closed after this long without a wake.
IDLE_CLOSE_S = 2.0
# At most one warning a cause this often while the database is unreachable.
WARN_EVERY_S = 1.0


class _Waker:
    """One per process (re-made in a forked child: a thread does not survive
    ``fork``, and Celery's pool and gunicorn's workers are forks)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._io = threading.Lock()  # the session: the thread's, or close()'s
        self._pending: dict[str, set[str]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._params: dict[str, Any] | None = None
        self._conn = None
        self._warned: dict[str, float] = {}
        self.sent = 0  # statements sent, for tests and metrics
        self.enabled = True  # tests turn it off to prove the sweeps suffice

    def put(self, channel: str, payload: str, params: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._cond:
            self._params = params
            self._pending[channel].add(payload)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="claimcheck-waker", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._cond.wait(timeout=IDLE_CLOSE_S)
                batch, self._pending = self._pending, defaultdict(set)
                params = self._params
            if not batch:
                self.close()  # idle: an idle process holds no session
                continue
            channels = [c for c, payloads in batch.items() for _ in payloads]
            payloads = [p for ps in batch.values() for p in ps]
            try:
                self._send(params, channels, payloads)
            except Exception as exc:  # a lost wake is served by a sweep
                self.close()
                self._warn(type(exc).__name__, exc, len(payloads))

    def _send(
        self, params: dict[str, Any] | None, channels: list[str], payloads: list[str]
    ) -> None:
        with self._io:
            if self._conn is None or self._conn.closed:
                import psycopg

                params = dict(params or {})
                params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
                self._conn = psycopg.connect(**params, autocommit=True)
            self._conn.execute(_NOTIFY_SQL, [channels, payloads])
            self.sent += 1

    def close(self) -> None:
        """Close the waker's session (the next wake opens another)."""
        with self._io:
            if self._conn is not None:
                with contextlib.suppress(Exception):  # already broken
                    self._conn.close()
            self._conn = None

    def _warn(self, cause: str, exc: Exception, dropped: int) -> None:
        now = time.monotonic()
        if now - self._warned.get(cause, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[cause] = now
            log.warning(
                "wake-up of %d listener(s) dropped (%s: %s); the sweeps serve them",
                dropped,
                cause,
                str(exc).splitlines()[0] if str(exc) else "",
            )


_waker = _Waker()
_waker_lock = threading.Lock()


def waker() -> _Waker:
    """This process's waker (a new one after a fork)."""
    global _waker
    if _waker._pid != os.getpid():
        with _waker_lock:
            if _waker._pid != os.getpid():
                _waker = _Waker()
    return _waker


def _params() -> dict[str, Any]:
    # Django's connection settings are per thread: read them in the caller's.
    params = connection.get_connection_params()
    params["application_name"] = "claimcheck waker"
    return params


def close() -> None:
    """Close this process's waker session (before a test database is dropped)."""
    waker().close()


def wake(channel: str, payload: str = "") -> None:
    """NOTIFY ``channel`` with ``payload`` once the current transaction
    commits (at once outside one), from this process's waker thread: never
    inside the write transaction, never on the caller's time."""
    params = _params()
    transaction.on_commit(lambda: waker().put(channel, payload, params))
