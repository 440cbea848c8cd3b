"""Transient faults: a database restart or a broker blip costs latency and a
clear 503, never a lost write (DESIGN.md, the developers' standards).

- ``TRANSIENT_DB_ERRORS`` / ``TRANSIENT_ERRORS``: what counts as transient.
  Only connection-level errors: ``OperationalError`` (connection refused or
  terminated, server starting up or shutting down, deadlock, serialization
  failure) and ``InterfaceError`` (the connection is already closed), as
  Django wraps them and as psycopg raises them where Django does not wrap;
  for the broker, kombu's and redis' connection errors. Domain errors,
  ``IntegrityError`` and programming errors are never transient.
- ``retry_transient(fn, ...)``: call ``fn`` until it returns, retrying a
  transient database error with capped exponential backoff and full jitter,
  for a bounded total time.
- ``answer_by(deadline)``: the statements a thread sends inside the block
  end by the deadline, even when a pooler holds them (a request that must
  answer in its own time).
- ``warn_transient(logger, what, exc)``: an outage's log line, one WARNING
  per cause per second with no traceback (how many were left out is in the
  next one): a 30 s outage is a few dozen lines, not a traceback per retry.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kombu.exceptions
import psycopg
import redis.exceptions
import tenacity
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connection, connections

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
TRANSIENT_BROKER_ERRORS: tuple[type[BaseException], ...] = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)
TRANSIENT_ERRORS = TRANSIENT_DB_ERRORS + TRANSIENT_BROKER_ERRORS


def is_transient(exc: BaseException) -> bool:
    """Is ``exc``, or an exception it was raised from, a transient fault?
    (Celery and Django sometimes wrap the original error.)"""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TRANSIENT_ERRORS):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def describe(exc: BaseException) -> str:
    """One line for a log: the class and the server's first line (no DSN,
    no password: psycopg's messages name host and port at most)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


# At most one line per cause in this long (seconds).
WARN_EVERY_S = 1.0
# (logger, cause) -> [when last logged (monotonic), lines left out since].
_warned: dict[tuple[str, str], list[float]] = {}
_warned_lock = threading.Lock()


def warn_transient(logger: logging.Logger, what: str, exc: BaseException) -> bool:
    """Log a transient fault of ``what`` (the cause: "worker heartbeat of
    x", "sweep budgets") as one WARNING line with ``describe(exc)`` and no
    traceback, at most once a second per cause; the lines left out meanwhile
    are counted in the next. True when this one was logged."""
    key = (logger.name, what)
    now = time.monotonic()
    with _warned_lock:
        entry = _warned.setdefault(key, [float("-inf"), 0.0])
        if now - entry[0] < WARN_EVERY_S:
            entry[1] += 1
            return False
        left_out, entry[0], entry[1] = int(entry[1]), now, 0.0
    more = f" ({left_out} more like it not logged)" if left_out else ""
    logger.warning("%s: %s%s", what, describe(exc), more)
    return True


def drop_broken_connection() -> None:
    """Close this thread's database connection so that the next query opens
    a new one. Outside a transaction only: inside ``atomic`` Django keeps the
    broken connection until the block exits (and then closes it itself)."""
    if connection.in_atomic_block:
        return
    try:
        connection.close()
    except Exception:  # closing a dead socket may raise again; it is closed anyway
        log.debug("closing the broken connection raised", exc_info=True)


def backoff_delay(attempt: int, *, base_s: float, cap_s: float, floor_s: float = 0.05) -> float:
    """Full jitter (AWS's "Exponential Backoff And Jitter"): random between 0
    and min(cap, base * 2^attempt), so that many clients retrying one
    struggling server spread out instead of arriving together; never below
    ``floor_s``, so that a tight loop cannot spin. The one backoff of the
    server side: database retries, heartbeats and webhook deliveries."""
    return max(floor_s, random.uniform(0, min(cap_s, base_s * (2**attempt))))


def retry_transient(
    fn: Callable[[], T],
    *,
    what: str,
    max_s: float,
    base_s: float = 0.2,
    cap_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn()`` and return its value; on a transient database error, drop
    the broken connection, wait (capped exponential backoff, full jitter) and
    call it again, until ``max_s`` seconds have passed since the first call.
    Then the last error is raised. Any other exception is raised at once.

    ``fn`` must be safe to repeat: either it did not commit, or a repeat
    recognises its own committed work (``finish_turn`` does). Inside a
    transaction (``atomic``) a broken connection cannot be replaced, so there
    ``fn`` runs once and its error goes to the transaction's owner.

    The cap is small on purpose: once the database is back, the caller should
    notice within a couple of seconds (a turn's heartbeat must stay fresh).
    Each retry is logged at WARNING with ``what``.
    """
    if connection.in_atomic_block:
        return fn()

    def wait(state: tenacity.RetryCallState) -> float:
        # Never past the deadline: the last try comes at max_s at the latest.
        left = max_s - (state.seconds_since_start or 0.0)
        return max(
            0.0, min(backoff_delay(state.attempt_number - 1, base_s=base_s, cap_s=cap_s), left)
        )

    def before_sleep(state: tenacity.RetryCallState) -> None:
        # One line per retry: its backoff already spaces them (0.2 s doubling
        # to 2 s), and each names the exact turn or task it holds up.
        log.warning(
            "%s: transient database error (%s); retry %d in %.2fs",
            what,
            describe(state.outcome.exception()),
            state.attempt_number,
            state.next_action.sleep,
        )

    def give_up(state: tenacity.RetryCallState) -> T:
        exc = state.outcome.exception()
        log.error(
            "%s: database still unreachable after %.1fs and %d attempt(s); giving up: %s",
            what,
            state.seconds_since_start,
            state.attempt_number,
            describe(exc),
        )
        raise exc

    def dropped(fn_: Callable[[], T]) -> Callable[[], T]:
        def call() -> T:
            try:
                return fn_()
            except TRANSIENT_DB_ERRORS:
                drop_broken_connection()
                raise

        return call

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(TRANSIENT_DB_ERRORS),
        stop=tenacity.stop_after_delay(max_s),
        wait=wait,
        sleep=sleep,
        before_sleep=before_sleep,
        retry_error_callback=give_up,
    )
    return retrying(dropped(fn))


class _Deadlines(threading.Thread):
    """One thread per process: at a deadline of ``answer_by``, the waiting
    thread's database connection is cut (its socket shut down), so the
    statement it waits on fails at once as a transient error."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="answer-by")
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, Any] = {}  # token -> the thread's connection wrapper
        self.cut: set[int] = set()
        self._tokens = itertools.count()

    def add(self, deadline: float, wrapper: Any) -> int:
        with self._cond:
            token = next(self._tokens)
            self._live[token] = wrapper
            heapq.heappush(self._heap, (deadline, token))
            if self._heap[0][1] == token:
                self._cond.notify()
            return token

    def remove(self, token: int) -> bool:
        """The block ended; True when its connection was cut."""
        with self._cond:  # no cut can be under way once this returns
            self._live.pop(token, None)
            if token in self.cut:
                self.cut.discard(token)
                return True
            return False

    def run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                wrapper = self._live.pop(token)
                self.cut.add(token)
                _cut(wrapper)


def _cut(wrapper: Any) -> None:
    """Shut down the socket of ``wrapper``'s open connection (psycopg's
    wait on it then reads end of file: OperationalError)."""
    conn = wrapper.connection
    if conn is None:
        return
    try:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception:  # closed meanwhile: nothing to cut
        return
    log.warning("a statement ran past its request's deadline: its connection is cut")


_deadlines: _Deadlines | None = None
_deadlines_pid = 0
_deadlines_lock = threading.Lock()


def _deadline_thread() -> _Deadlines:
    global _deadlines, _deadlines_pid
    with _deadlines_lock:
        if _deadlines is None or _deadlines_pid != os.getpid() or not _deadlines.is_alive():
            _deadlines = _Deadlines()
            _deadlines.start()
            _deadlines_pid = os.getpid()
        return _deadlines


# psycopg's floor for a connect's timeout (libpq's convention).
MIN_CONNECT_TIMEOUT_S = 2


@contextlib.contextmanager
def answer_by(deadline: float, *, using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """The statements this thread sends inside the block end by ``deadline``
    (``time.monotonic()``): past it the thread's connection is cut, and the
    statement under way fails as a transient error (``TRANSIENT_DB_ERRORS``)
    for the caller to answer with what it has. Behind PgBouncer a statement
    can otherwise wait as long as the pooler holds it: through an outage and
    up to ``server_login_retry`` after it. A connection the block opens
    times out by the deadline too (not before ``MIN_CONNECT_TIMEOUT_S``;
    with Django's pool, by ``DATABASE_POOL_TIMEOUT_S``), and none is opened
    past it. A cut connection is closed when the block ends (the next
    request opens a new one)."""
    wrapper = connections[using]
    pooled = bool((wrapper.settings_dict.get("OPTIONS") or {}).get("pool"))
    if not pooled:
        # This thread's wrapper only (a pool's parameters are its own).
        own_params = wrapper.get_connection_params

        def bounded_params() -> dict[str, Any]:
            params = own_params()
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationalError("the request's deadline passed before it could connect")
            timeout = int(params.get("connect_timeout") or 0) or 2**31
            params["connect_timeout"] = max(MIN_CONNECT_TIMEOUT_S, min(timeout, int(left) + 1))
            return params

        wrapper.get_connection_params = bounded_params
    watchdog = _deadline_thread()
    token = watchdog.add(deadline, wrapper)
    try:
        yield
    finally:
        if not pooled:
            del wrapper.get_connection_params
        if watchdog.remove(token) and not wrapper.in_atomic_block:
            with contextlib.suppress(Exception):  # a cut socket may raise again; closed anyway
                wrapper.close()
