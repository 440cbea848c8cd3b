"""Celery tasks: thin; take ids, call one service. The ledger decides whether
there is anything to do, so a duplicate message is a no-op."""

from __future__ import annotations

import uuid

from celery import shared_task

from core import observe
from core.dispatch import DELIVER
from health.services import sweep_run, tolerate_transient

from . import callbacks, delivery, obligations


@shared_task(name=DELIVER, ignore_result=True)
def deliver(delivery_id: str) -> None:
    # An outage skips the attempt; the delivery stays due and the sweep sends it.
    with tolerate_transient(f"delivery {delivery_id}"):
        observe.delivery_attempt(delivery.send(delivery_id=uuid.UUID(delivery_id)))


@shared_task(name="tickets.sweep_deliveries", ignore_result=True)
def sweep_deliveries() -> None:
    with sweep_run("deliveries"):
        observe.swept("deliveries", delivery.sweep_due_deliveries())


@shared_task(name="tickets.sweep_obligations", ignore_result=True)
def sweep_obligations() -> None:
    with sweep_run("obligations"):
        overdue = obligations.sweep_overdue()
        retried = callbacks.retry_pending_callbacks()
        observe.swept("obligations", {"overdue": len(overdue), "callbacks": retried})


@shared_task(name="tickets.prune_ledger", ignore_result=True)
def prune_ledger() -> None:
    """Beat's daily retention run when RETENTION_DAYS is set."""
    from django.conf import settings  # noqa: PLC0415

    from . import retention  # noqa: PLC0415

    if not settings.RETENTION_DAYS:
        return
    with tolerate_transient("retention"), observe.sweep("retention"):
        report = retention.prune(
            older_than_days=settings.RETENTION_DAYS,
            batch=settings.RETENTION_BATCH,
            pause_ratio=settings.RETENTION_PAUSE_RATIO,
        )
        observe.swept(
            "retention",
            {"pruned_traces": report.counts["traces"], "pruned_tickets": report.counts["tickets"]},
        )


@shared_task(name="tickets.sweep_schedules", ignore_result=True)
def sweep_schedules() -> None:
    """Beat's schedules tick: admit every due slot (tickets/schedules.py)."""
    from . import schedules  # here, so the module loads only where beat's tick runs

    with sweep_run("schedules"):
        fired = schedules.fire_due()
        observe.swept("schedules", {"schedules": fired.schedules, **fired.outcomes})
