"""The raw Celery floor of bench/turns.py: a Celery app of its own on the
same broker, whose one task does nothing but count itself done.

Started as its own worker (``celery -A bench.noop_app worker -Q bench_noop``)
with the same pool, concurrency, prefetch, serializer and acknowledgement
settings as the project's worker, and no Django. The count is one Redis
INCR (about 0.05 ms); the task that brings it to ``target`` records the time,
so the bench reads the moment the last task finished, not its next poll.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

BROKER_URL = os.environ.get(
    "CELERY_BROKER_URL", os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
)
QUEUE = "bench_noop"
DONE_KEY = "bench:noop:done"
FINISHED_KEY = "bench:noop:finished_at"

# Not the current app of a process that imports it beside Django's
# (bench/turns.py's floor): Celery's current_app, which the project's
# publishing reads (core/dispatch.py), stays config.celery's there.
app = Celery("bench_noop", broker=BROKER_URL, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    result_backend=None,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 6 * 3600},
)

_redis: redis.Redis | None = None


def _client() -> redis.Redis:
    global _redis
    if _redis is None:  # one client per pool process, made after the fork
        _redis = redis.Redis.from_url(BROKER_URL)
    return _redis


@app.task(name="bench.noop", ignore_result=True)
def noop(target: int) -> None:
    if _client().incr(DONE_KEY) == target:
        _client().set(FINISHED_KEY, repr(time.time()))
