"""Celery tasks: thin; take ids, call one service. The ledger decides whether
there is anything to do, so a duplicate message is a no-op."""

from __future__ import annotations

import uuid

from celery import shared_task

from config.dispatch import DELIVER

from . import callbacks, delivery, obligations


@shared_task(name=DELIVER, ignore_result=True)
def deliver(delivery_id: str) -> None:
    delivery.send(delivery_id=uuid.UUID(delivery_id))


@shared_task(name="tickets.sweep_deliveries", ignore_result=True)
def sweep_deliveries() -> None:
    delivery.sweep_due_deliveries()


@shared_task(name="tickets.sweep_obligations", ignore_result=True)
def sweep_obligations() -> None:
    obligations.sweep_overdue()
    callbacks.retry_pending_callbacks()
