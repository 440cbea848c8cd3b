"""An outcome a live worker holds while the ledger cannot take it.

A runner that returned has stopped: its worker holds the proof (the outcome,
and with it ``ran_s``) and retries the finish through an outage. Behind a
pooler the worker may reach the database many seconds after the control
worker's sweep does (PgBouncer retries a failed server login only every
``server_login_retry``): the sweep must not take the missing finish for a
turn that never stopped. So the worker says it holds an outcome through the
broker's Redis, which does not wait on the database or the pooler: one key
per turn, ``claimcheck:held:<turn id>``, naming the turn's ``seq``, short-lived
(``TTL_S``) and refreshed while the finish is retried, deleted when it lands
or is given up. A worker that dies stops refreshing it; a Redis that is away
announces nothing, and the sweep quarantines as before (fail closed).

The budget sweep does not quarantine an interrupting turn that a live worker
holds an outcome of (``holding``), for at most ``FINISH_RETRY_MAX_S`` past its
stop window; the finish, when it lands, is judged as any late outcome
(docs/explanation/design.md, "A late outcome").

Only a finish still under way after ``ANNOUNCE_AFTER_S`` is announced: one
that lands in time costs a dict entry and no Redis round trip. The writes are
made by one thread per process that never touches the database (the turn's
own thread and the heartbeat thread may both be waiting on it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

from core.transient import describe

log = logging.getLogger(__name__)

KEY_PREFIX = "claimcheck:held:"
# A finish still under way this long after the runner returned is announced
# (up to TICK_S later: how often the thread looks).
ANNOUNCE_AFTER_S = 1.0
TICK_S = 0.5
# The announcement is written again this often, and lives this long unless
# written again: a dead worker's stops holding its turn within TTL_S.
REFRESH_S = 2.0
TTL_S = 10
REDIS_TIMEOUT_S = 2.0
# At most one WARNING this often while Redis refuses the announcements.
LOG_EVERY_S = 30.0


def key(turn_id: uuid.UUID | str) -> str:
    return f"{KEY_PREFIX}{turn_id}"


@lru_cache(maxsize=2)
def _client_for(url: str) -> redis.Redis:
    if url.startswith("redis+socket://"):  # the embedded broker's unix socket
        url = "unix://" + url[len("redis+socket://") :]
    return redis.Redis.from_url(
        url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )


def _client() -> redis.Redis:
    return _client_for(settings.CELERY_BROKER_URL)


def holding(turn_id: uuid.UUID, seq: int) -> dict | None:
    """What the worker that holds an outcome of this exact turn (``seq``)
    announced, or None (nobody does, or Redis cannot say)."""
    try:
        raw = _client().get(key(turn_id))
    except (redis.RedisError, OSError) as exc:
        log.warning("cannot read whether turn %s's outcome is held: %s", turn_id, describe(exc))
        return None
    if raw is None:
        return None
    try:
        held = json.loads(raw)
    except ValueError:
        return None
    return held if isinstance(held, dict) and held.get("seq") == seq else None


@dataclass
class _Entry:
    turn_id: uuid.UUID
    seq: int
    kind: str
    ran_s: float | None
    due: float  # monotonic: when it is written (again)
    written: bool = False
    done: bool = False


class _HolderThread(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="held-outcomes")
        self._cond = threading.Condition()
        self._entries: dict[uuid.UUID, _Entry] = {}
        self._logged_at = float("-inf")

    def add(self, entry: _Entry) -> None:
        # No wake-up: the thread looks every TICK_S (a turn's finish costs
        # a dict entry, not a thread switch).
        with self._cond:
            self._entries[entry.turn_id] = entry

    def remove(self, entry: _Entry) -> None:
        with self._cond:
            if self._entries.get(entry.turn_id) is not entry:
                return
            if not entry.written:  # never announced: nothing to take back
                del self._entries[entry.turn_id]
                return
            entry.done, entry.due = True, 0.0
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [e for e in self._entries.values() if e.due <= now]
                if not due:
                    self._cond.wait(TICK_S)
                    continue
            for entry in due:
                self._write(entry)

    def _write(self, entry: _Entry) -> None:
        try:
            if entry.done:
                _client().delete(key(entry.turn_id))
            else:
                value = {
                    "seq": entry.seq,
                    "outcome": entry.kind,
                    "ran_s": entry.ran_s,
                    "host": os.uname().nodename,
                    "pid": os.getpid(),
                }
                _client().set(key(entry.turn_id), json.dumps(value), ex=TTL_S)
                if not entry.written:
                    log.warning(
                        "turn %s seq %s: its %s outcome is held until the ledger takes it",
                        entry.turn_id,
                        entry.seq,
                        entry.kind,
                    )
            ok = True
        except (redis.RedisError, OSError) as exc:
            ok = False
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning("cannot announce a held outcome: %s", describe(exc))
        with self._cond:
            if entry.done:  # taken back (or, Redis away, left to expire within TTL_S)
                if self._entries.get(entry.turn_id) is entry:
                    del self._entries[entry.turn_id]
                return
            entry.written = entry.written or ok
            entry.due = time.monotonic() + REFRESH_S
            if ok and entry.turn_id not in self._entries:
                # Taken back while this write was under way: take it back now.
                entry.done, entry.due = True, 0.0
                self._entries[entry.turn_id] = entry


_thread: _HolderThread | None = None
_thread_pid = 0
_thread_lock = threading.Lock()


def _holder() -> _HolderThread:
    """This process's thread (a forked pool process starts its own)."""
    global _thread, _thread_pid
    with _thread_lock:
        if _thread is None or _thread_pid != os.getpid() or not _thread.is_alive():
            _thread = _HolderThread()
            _thread.start()
            _thread_pid = os.getpid()
        return _thread


@contextlib.contextmanager
def held(turn_id: uuid.UUID, seq: int, kind: str, ran_s: float | None) -> Iterator[None]:
    """Around the finish of an outcome the runner returned: announced if
    the finish is still under way after ``ANNOUNCE_AFTER_S``, taken back
    when it ends (landed, refused, or given up)."""
    entry = _Entry(turn_id, seq, kind, ran_s, due=time.monotonic() + ANNOUNCE_AFTER_S)
    holder = _holder()
    holder.add(entry)
    try:
        yield
    finally:
        holder.remove(entry)
