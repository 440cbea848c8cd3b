"""A Celery worker whose every process counts the SQL statements it sends,
for bench/costs.py's turns with worker processes:

    python -m bench.counted_celery -A config worker -Q turns,control -c 2 ...

(the arguments are Celery's). Statements are counted at psycopg's cursor
(Django's cursors and the raw fast paths alike; ``executemany`` once), in
the main process and in every pool process (each counts from its fork),
the waker's (core/wakes.py: the NOTIFYs after commit, on a thread and
session of their own) apart. A thread of each process adds what it counted
to a Redis hash (``KEY`` on the bench's broker) every ``FLUSH_S``: a few
Redis commands a second, none on the statement's path. The bench reads the
hash once the counts stop moving.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psycopg
import redis

KEY = "bench:counted:statements"
FLUSH_S = 0.2
_lock = threading.Lock()
_counts = {"pid": 0, "statements": 0, "wakes": 0}


def _flush_forever(pid: int) -> None:
    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    sent = {"statements": 0, "wakes": 0}
    while True:
        time.sleep(FLUSH_S)
        with _lock:
            if _counts["pid"] != pid:
                return
            now = {k: _counts[k] for k in sent}
        delta = {k: now[k] - sent[k] for k in sent if now[k] != sent[k]}
        if delta:
            pipe = client.pipeline()
            for k, v in delta.items():
                pipe.hincrby(KEY, k, v)
            pipe.execute()
            sent = now


def _count() -> None:
    kind = "wakes" if threading.current_thread().name == "claimcheck-waker" else "statements"
    with _lock:
        if _counts["pid"] != os.getpid():  # a fork: count from zero, flush from here
            _counts.update(pid=os.getpid(), statements=0, wakes=0)
            threading.Thread(
                target=_flush_forever, args=(os.getpid(),), name="bench-counter", daemon=True
            ).start()
        _counts[kind] += 1


def install() -> None:
    plain, many = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def execute(cur, *a, **kw):
        _count()
        return plain(cur, *a, **kw)

    def executemany(cur, *a, **kw):
        _count()
        return many(cur, *a, **kw)

    psycopg.Cursor.execute = execute
    psycopg.Cursor.executemany = executemany


if __name__ == "__main__":
    install()
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    main()
