"""Celery tasks: thin; take ids, call one service. The ticket row decides
whether there is anything to do, so a duplicate message is a no-op."""

from __future__ import annotations

import uuid

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from core import observe
from core.dispatch import RUN_TICKET
from health.services import sweep_run

from . import dispatcher, turns
from . import worker as _worker  # connects the shutdown signals too
from .ports import case_keeper


@shared_task(name=RUN_TICKET, bind=True, ignore_result=True)
def run_ticket(self, ticket_id: str) -> None:
    # A backlog on the endpoint: this process starts its next tickets itself
    # (turns.run_ticket) until the worker is told to shut down.
    turns.run_ticket(
        ticket_id=uuid.UUID(ticket_id),
        celery_task_id=self.request.id or "",
        keep_going=lambda: not _worker.SHUTDOWN.is_set(),
    )


@shared_task(name="runtime.sweep_budgets", ignore_result=True)
def sweep_budgets() -> None:
    with sweep_run("budgets"):
        observe.swept("budgets", turns.sweep_budgets())
        # Traces over their budget: closed by the clock, their turns stopped.
        observe.swept("trace_budgets", turns.sweep_trace_budgets())
        # Stop requests of slots whose worker can no longer act on them.
        case_keeper().resolve_stale_stops()


@shared_task(name="runtime.sweep_lost_dispatches", ignore_result=True)
def sweep_lost_dispatches() -> None:
    with sweep_run("lost_dispatches"):
        observe.swept("lost_dispatches", turns.sweep_lost_dispatches())


@worker_ready.connect
def _start_dispatcher(sender=None, **kwargs) -> None:
    """A worker consuming the control queue runs the dispatcher thread."""
    queues = sender.app.amqp.queues.consume_from if sender is not None else {}
    dispatcher.start_in_worker(queues.keys() if queues else ())


@worker_shutdown.connect
def _stop_dispatcher(**kwargs) -> None:
    dispatcher.stop_in_worker()
