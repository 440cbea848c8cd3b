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


def publish(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Send ``task_name(*args)`` once the current transaction commits."""

    def send() -> None:
        from config.celery import app

        try:
            app.send_task(task_name, args=list(args), countdown=countdown)
        except Exception:  # broker down: the sweeps re-publish from the ledger
            log.exception("publish of %s%r failed; the sweep will retry", task_name, args)

    transaction.on_commit(send)
