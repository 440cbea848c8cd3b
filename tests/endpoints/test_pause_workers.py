"""Pause and drain with real Celery workers: a ticket queued on a paused
endpoint starts once its owner resumes it, and a worker told to stop
consuming the turns queue (Celery's cancel_consumer) takes no turn until
it is told to consume again (add_consumer)."""

from __future__ import annotations

import pytest

from runtime import services as runtime_services
from runtime.models import Worker, WorkerEvent
from tests.conftest import broker_queue_length, wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _state(ticket_id) -> str:
    return Ticket.objects.get(id=ticket_id).state


def test_a_ticket_queued_while_paused_starts_after_the_resume(worker, make_endpoint, staff_user):
    make_endpoint("drain.paused", owners=[staff_user.username])
    make_endpoint("drain.other")
    runtime_services.pause_endpoint(address="drain.paused", user=staff_user, reason="deploying")
    waiting = admit_ticket(endpoint="drain.paused", input={"n": 1}).ticket
    # The signal that the worker and its dispatcher were free to start it: a
    # ticket admitted after it, on another endpoint, finished.
    other = admit_ticket(endpoint="drain.other", input={"n": 2}).ticket
    wait_for(lambda: _state(other.id) == "succeeded", timeout=30, message="the other ticket")
    assert _state(waiting.id) == "queued"
    runtime_services.resume_endpoint(address="drain.paused", user=staff_user, reason="deployed")
    wait_for(lambda: _state(waiting.id) == "succeeded", timeout=30, message="the resumed ticket")


def test_a_worker_told_to_stop_consuming_takes_no_turn_until_told_to_resume(
    celery_procs, make_endpoint, staff_user
):
    celery_procs.worker("turns", queues="turns", concurrency=1)
    wait_for(
        lambda: Worker.objects.filter(name__startswith="turns@", consuming=["turns"]).first(),
        timeout=30,
        message="the turns worker to register",
    )
    name = Worker.objects.get(name__startswith="turns@").name
    make_endpoint("drain.echo")
    warm = admit_ticket(endpoint="drain.echo", input={"n": 0}).ticket
    wait_for(lambda: _state(warm.id) == "succeeded", timeout=30, message="a first turn")

    row, answered = runtime_services.set_worker_consuming(
        worker=name, queue="turns", consume=False, user=staff_user, reason="host maintenance"
    )
    assert answered and row.consuming == []
    event = WorkerEvent.objects.get(worker=name)
    assert (event.kind, event.actor, event.detail["reason"]) == (
        "consumer_cancelled",
        "user:staff",
        "host maintenance",
    )
    # What the worker reports of itself, on its heartbeat: nothing consumed.
    seen = Worker.objects.get(name=name).last_seen_at
    wait_for(
        lambda: Worker.objects.filter(name=name, consuming=[], last_seen_at__gt=seen).exists(),
        timeout=10,
        message="the worker's own report of its consumer",
    )

    ticket = admit_ticket(endpoint="drain.echo", input={"n": 1}).ticket
    # Its message is published (the dispatcher runs in the worker) and stays
    # in the queue: nobody takes it. Two heartbeats later, still there.
    wait_for(lambda: broker_queue_length("turns") == 1, timeout=10, message="the message")
    seen = Worker.objects.get(name=name).last_seen_at
    wait_for(
        lambda: Worker.objects.filter(name=name, last_seen_at__gt=seen).exists(),
        timeout=10,
        message="a heartbeat",
    )
    seen = Worker.objects.get(name=name).last_seen_at
    wait_for(
        lambda: Worker.objects.filter(name=name, last_seen_at__gt=seen).exists(),
        timeout=10,
        message="another heartbeat",
    )
    assert _state(ticket.id) == "queued" and broker_queue_length("turns") == 1

    row, answered = runtime_services.set_worker_consuming(
        worker=name, queue="turns", consume=True, user=staff_user, reason="maintenance done"
    )
    assert answered and row.consuming == ["turns"]
    wait_for(lambda: _state(ticket.id) == "succeeded", timeout=30, message="the turn")
    assert list(WorkerEvent.objects.filter(worker=name).values_list("kind", flat=True)) == [
        "consumer_cancelled",
        "consumer_added",
    ]
