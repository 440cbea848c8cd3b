"""Celery tasks: thin; take ids, call one service. The ticket row decides
whether there is anything to do, so a duplicate message is a no-op."""

from __future__ import annotations

import uuid

from celery import shared_task

from config.dispatch import RUN_TICKET

from . import runtime


@shared_task(name=RUN_TICKET, bind=True, ignore_result=True)
def run_ticket(self, ticket_id: str) -> None:
    runtime.run_ticket(ticket_id=uuid.UUID(ticket_id), celery_task_id=self.request.id or "")


@shared_task(name="endpoints.sweep_budgets", ignore_result=True)
def sweep_budgets() -> None:
    runtime.sweep_budgets()


@shared_task(name="endpoints.sweep_lost_dispatches", ignore_result=True)
def sweep_lost_dispatches() -> None:
    runtime.sweep_lost_dispatches()
