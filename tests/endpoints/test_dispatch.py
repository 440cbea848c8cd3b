"""One broker message per turn: admission publishes only when the endpoint's
lock is free; otherwise the dispatch is owed and the release publishes it.
Real PostgreSQL and real Redis (no worker: the queue is counted)."""

from __future__ import annotations

import pytest

from endpoints import runtime
from endpoints.models import EndpointLock
from tests.conftest import broker_queue_length, purge_broker
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)


def owed(address: str) -> int:
    return EndpointLock.objects.get(endpoint__address=address).owed


def test_admissions_behind_a_held_lock_publish_nothing_until_the_release(make_endpoint):
    purge_broker()
    make_endpoint("one")
    first = admit_ticket(endpoint="one", input={"n": 0}).ticket
    assert broker_queue_length("turns") == 1
    started = runtime.start_turn(ticket_id=first.id)  # as the worker would
    assert started is not None
    queued = [admit_ticket(endpoint="one", input={"n": i}).ticket for i in (1, 2, 3)]
    assert broker_queue_length("turns") == 1  # nothing new: the lock is held
    assert owed("one") == 3
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=runtime.Outcome.success({"ok": True}),
        source="test",
    )
    assert broker_queue_length("turns") == 2  # the release published one
    assert owed("one") == 2
    # Every queued ticket is still reachable: run the chain in-process.
    for ticket in queued:
        assert runtime.run_ticket(ticket_id=ticket.id) is not None
    assert set(Ticket.objects.filter(endpoint__address="one").values_list("state", flat=True)) == {
        "succeeded"
    }
    assert owed("one") == 0


def test_a_message_that_finds_the_lock_held_is_owed_and_republished(make_endpoint):
    purge_broker()
    make_endpoint("two")
    a = admit_ticket(endpoint="two", input={"n": "a"}).ticket
    b = admit_ticket(endpoint="two", input={"n": "b"}).ticket
    assert broker_queue_length("turns") == 2  # both saw a free lock
    started = runtime.start_turn(ticket_id=a.id)
    assert runtime.start_turn(ticket_id=b.id) is None  # b's message bounced
    assert owed("two") == 1
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=runtime.Outcome.success({}),
        source="test",
    )
    assert owed("two") == 0
    assert broker_queue_length("turns") == 3
    assert runtime.run_ticket(ticket_id=b.id) is not None


def test_a_release_with_nothing_owed_publishes_nothing(make_endpoint):
    purge_broker()
    make_endpoint("three")
    a = admit_ticket(endpoint="three", input={}).ticket
    runtime.run_ticket(ticket_id=a.id)
    assert broker_queue_length("turns") == 1  # only a's own admission message
