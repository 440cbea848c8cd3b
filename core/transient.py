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
- ``warn_transient(logger, what, exc)``: an outage's log line, one WARNING
  per cause per second with no traceback (how many were left out is in the
  next one): a 30 s outage is a few dozen lines, not a traceback per retry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import kombu.exceptions
import psycopg
import redis.exceptions
import tenacity
from django.db import InterfaceError, OperationalError, connection

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


def backoff_delay(attempt: int, *, base_s: float, cap_s: float) -> float:
    """Full jitter: random between 0 and min(cap, base * 2^attempt), never
    below a small floor so a tight loop cannot spin."""
    return max(0.05, random.uniform(0, min(cap_s, base_s * (2**attempt))))


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
