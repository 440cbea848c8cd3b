"""Prometheus series, incremented where the work happens (hooks in
``core/observe.py``). Under gunicorn and Celery's prefork pool each process
counts on its own, so with ``PROMETHEUS_MULTIPROC_DIR`` set (one directory
per host, emptied before the processes start) prometheus-client writes every
process's values to memory-mapped files there and a scrape adds them up
(config/metrics.py serves them, with the ledger's gauges read at scrape
time). Without the variable (``make test``, a single process) the values
live in the process."""

from __future__ import annotations

import os

from prometheus_client import Counter, Histogram

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
_SWEEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

ADMISSIONS = Counter(
    "claimcheck_admissions",
    "Ticket admissions by outcome (admitted, duplicate, refused) and refusal reason "
    "(the error code; empty unless refused).",
    ["outcome", "reason"],
)
TRANSITIONS = Counter(
    "claimcheck_ticket_transitions",
    "Ticket state changes (core/observe.transition), committed, by edge.",
    ["from_state", "to_state"],
)
TURNS_STARTED = Counter("claimcheck_turns_started", "Turns started.")
TURNS = Counter(
    "claimcheck_turns",
    "Turns that ended, by the ticket state they left it in: succeeded, failed, waiting "
    "(for children), recovering (uncertain stop: quarantine), cancelled.",
    ["outcome"],
)
TURN_DURATION = Histogram(
    "claimcheck_turn_duration_seconds",
    "From a turn's start to the ticket leaving running, by outcome.",
    ["outcome"],
    buckets=_DURATION_BUCKETS,
)
QUEUE_WAIT = Histogram(
    "claimcheck_queue_wait_seconds",
    "From a ticket's admission to the start of its turn.",
    buckets=_DURATION_BUCKETS,
)
DELIVERY_ATTEMPTS = Counter(
    "claimcheck_delivery_attempts",
    "Webhook delivery attempts by status: 2xx, 3xx, 4xx, 5xx (the receiver's answer), "
    "error (no answer: connection, timeout, DNS) or refused (the URL policy refused the target).",
    ["status"],
)
SWEEP_DURATION = Histogram(
    "claimcheck_sweep_duration_seconds",
    "Wall time of each sweep run, by sweep.",
    ["sweep"],
    buckets=_SWEEP_BUCKETS,
)
SWEEP_RUNS = Counter(
    "claimcheck_sweep_runs",
    "Sweep runs by sweep and result: acted (did something), idle (nothing to do), "
    "skipped (another sweeper held the lock, or a transient fault).",
    ["sweep", "result"],
)
SWEEP_ACTIONS = Counter(
    "claimcheck_sweep_actions",
    "What the sweeps did, by sweep and action (interrupted, quarantined, held, redispatched, "
    "published, overdue, callbacks, pruned_tickets, ...).",
    ["sweep", "action"],
)


def multiprocess_dir() -> str:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
