"""The lost-dispatch sweep re-publishes only messages that are really gone
(runtime/turns/dispatch.py): a queued ticket whose message waits in the
broker's queue, or is held reserved by a live worker whose every slot is
busy, only waits for a slot. Real Redis; a real worker for the reservation."""

from __future__ import annotations

import json
import logging
import signal

import pytest
import redis
from django.conf import settings as django_settings

from runtime import turns as runtime
from tests.conftest import broker_queue_length, purge_broker, queued_tasks, wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)

LOST = "whose messages were lost"


def _broker() -> redis.Redis:
    return redis.Redis.from_url(django_settings.CELERY_BROKER_URL)


def _drop_message(ticket_id) -> None:
    """The broker loses one ticket's message."""
    with _broker() as client:
        for raw in client.lrange("turns", 0, -1):
            if str(ticket_id) in json.loads(raw)["headers"]["argsrepr"]:
                assert client.lrem("turns", 1, raw) == 1
                return
    raise AssertionError(f"no message of {ticket_id} in the queue")


def test_a_ticket_waiting_in_the_queue_is_not_redispatched(make_endpoint, settings, caplog):
    purge_broker()
    make_endpoint("lost.a")
    make_endpoint("lost.b")
    a = admit_ticket(endpoint="lost.a", input={}).ticket
    b = admit_ticket(endpoint="lost.b", input={}).ticket
    assert sorted(runtime.dispatch_owed()) == sorted([a.id, b.id])  # no worker: both wait
    settings.REDISPATCH_AFTER_S = 0
    caplog.set_level(logging.INFO, logger="runtime.turns.dispatch")
    for _ in range(3):
        assert runtime.sweep_lost_dispatches() == []
    assert broker_queue_length("turns") == 2  # nothing piled up
    assert LOST not in caplog.text

    _drop_message(b.id)
    assert runtime.sweep_lost_dispatches() == [b.id]
    assert LOST in caplog.text
    assert sorted(args[0] for _, args in queued_tasks("turns")) == sorted([str(a.id), str(b.id)])
    assert runtime.sweep_lost_dispatches() == []  # published once, not again


@pytest.mark.integration
def test_a_message_reserved_by_a_busy_worker_waits_until_that_worker_dies(
    celery_procs, make_endpoint, settings
):
    celery_procs.worker("busy", queues="turns", concurrency=1)
    make_endpoint("lost.slow", path="runtime.demo.sleep", isolation="inline")
    make_endpoint("lost.c")
    make_endpoint("lost.d")
    slow = admit_ticket(endpoint="lost.slow", input={"seconds": 120}).ticket
    wait_for(lambda: Ticket.objects.get(id=slow.id).state == "running", timeout=30, message="slow")
    c = admit_ticket(endpoint="lost.c", input={}).ticket
    d = admit_ticket(endpoint="lost.d", input={}).ticket

    def held() -> tuple[int, int]:
        with _broker() as client:
            return client.hlen("unacked"), client.llen("turns")

    # The only slot is busy: the worker reserves one message (prefetch), the
    # other waits in the queue.
    wait_for(lambda: held() == (1, 1), timeout=30, message="one reserved, one queued")
    settings.REDISPATCH_AFTER_S = 0
    assert runtime.sweep_lost_dispatches() == []
    assert held() == (1, 1)

    # The worker dies holding its reservation: that message is gone (Redis
    # would give it back only after the visibility timeout, days away).
    with _broker() as client:
        (reserved,) = client.hvals("unacked")
    reserved_id = json.loads(reserved)[0]["headers"]["argsrepr"].strip("[]'")
    assert reserved_id in (str(c.id), str(d.id))
    celery_procs.kill("busy", signal.SIGKILL)
    assert [str(t) for t in runtime.sweep_lost_dispatches()] == [reserved_id]
    assert broker_queue_length("turns") == 2
