"""Publishing work to the broker: by task name, after the transaction commits.

Services never import tasks (no import cycle between the runtime and
admission). A publish that fails after commit loses nothing: the ticket row is
the truth and beat's lost-dispatch sweep publishes it again.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

log = logging.getLogger(__name__)

RUN_TICKET = "endpoints.run_ticket"
DELIVER = "tickets.deliver"
# The channel that wakes the dispatcher (endpoints/dispatcher.py): admission
# notifies it in the statement that marks a ticket as owing a dispatch.
DISPATCH_CHANNEL = "claimcheck_dispatch"


def wake_dispatcher(using: str = "default") -> None:
    """Notify the dispatcher, delivered when the current transaction commits
    (PostgreSQL's NOTIFY is transactional; a rollback sends nothing). On
    SQLite there is no LISTEN: the dispatcher polls."""
    from django.db import connections

    conn = connections[using]
    if conn.vendor != "postgresql":
        return
    with conn.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, '')", [DISPATCH_CHANNEL])


def publish_now(task_name: str, ids: list[str]) -> int:
    """Send ``task_name(id)`` for each id at once (the caller is outside any
    transaction), over one producer connection. Returns how many were sent
    (the first ones); the caller decides what becomes of the rest
    (``endpoints.runtime.dispatch`` marks them owed again)."""
    from config.celery import app

    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for one in ids:
                app.send_task(task_name, args=[one], producer=producer)
                sent += 1
    except Exception:  # broker down: the caller marks them owed again (or the sweep)
        log.exception(
            "publish of %d %s message(s) failed; they stay owed", len(ids) - sent, task_name
        )
    return sent


def publish(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Send ``task_name(*args)`` once the current transaction commits."""

    def send() -> None:
        from config.celery import app

        try:
            app.send_task(task_name, args=list(args), countdown=countdown)
        except Exception:  # broker down: the sweeps re-publish from the ledger
            log.exception("publish of %s%r failed; the sweep will retry", task_name, args)

    transaction.on_commit(send)
