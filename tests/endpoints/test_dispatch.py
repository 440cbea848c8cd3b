"""One broker message per turn, and no ticket left behind: admission
publishes only when the endpoint's lock is free; a ticket whose message is
used up without starting it is marked, and the next release publishes it.
Real PostgreSQL and real Redis (no worker: the queue is counted)."""

from __future__ import annotations

import pytest

from endpoints import runtime
from tests.conftest import broker_queue_length, purge_broker, queued_tasks
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)


def marked(address: str) -> list:
    return list(
        Ticket.objects.filter(endpoint__address=address, state="queued", needs_dispatch=True)
        .order_by("id")
        .values_list("id", flat=True)
    )


def succeed(started) -> None:
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=runtime.Outcome.success({"ok": True}),
        source="test",
    )


def test_admissions_behind_a_held_lock_publish_nothing_until_the_release(make_endpoint):
    purge_broker()
    make_endpoint("one")
    first = admit_ticket(endpoint="one", input={"n": 0}).ticket
    assert broker_queue_length("turns") == 1
    started = runtime.start_turn(ticket_id=first.id)  # as the worker would
    assert started is not None
    queued = [admit_ticket(endpoint="one", input={"n": i}).ticket for i in (1, 2, 3)]
    assert broker_queue_length("turns") == 1  # nothing new: the lock is held
    assert marked("one") == [t.id for t in queued]
    succeed(started)
    # The release published the oldest marked ticket, and only that one.
    assert queued_tasks("turns")[-1] == ("endpoints.run_ticket", [str(queued[0].id)])
    assert broker_queue_length("turns") == 2
    assert marked("one") == [queued[1].id, queued[2].id]
    for ticket in queued:  # the chain: each release publishes the next
        assert runtime.run_ticket(ticket_id=ticket.id) is not None
    assert broker_queue_length("turns") == 4  # one message per turn
    states = set(Ticket.objects.filter(endpoint__address="one").values_list("state", flat=True))
    assert states == {"succeeded"}


def test_a_release_publishes_the_marked_ticket_not_one_with_a_message_in_flight(make_endpoint):
    """A counter of owed dispatches would publish the oldest queued ticket
    (b, whose own message is still in flight) and strand c."""
    purge_broker()
    make_endpoint("two")
    a = admit_ticket(endpoint="two", input={"n": "a"}).ticket
    b = admit_ticket(endpoint="two", input={"n": "b"}).ticket
    c = admit_ticket(endpoint="two", input={"n": "c"}).ticket
    assert broker_queue_length("turns") == 3  # all three saw a free lock
    started = runtime.start_turn(ticket_id=a.id)
    assert runtime.start_turn(ticket_id=c.id) is None  # c's message came first and bounced
    assert marked("two") == [c.id]
    succeed(started)
    assert queued_tasks("turns")[-1] == ("endpoints.run_ticket", [str(c.id)])
    assert marked("two") == []
    # b's own message starts b (the oldest); c's republished one then bounces
    # and marks c again; b's release publishes c.
    started_b = runtime.start_turn(ticket_id=b.id)
    assert started_b.ticket.id == b.id
    assert runtime.start_turn(ticket_id=c.id) is None
    succeed(started_b)
    assert queued_tasks("turns")[-1] == ("endpoints.run_ticket", [str(c.id)])
    assert runtime.run_ticket(ticket_id=c.id) is not None
    assert Ticket.objects.get(id=c.id).state == "succeeded"


def test_a_message_that_starts_an_older_ticket_marks_its_own(make_endpoint):
    purge_broker()
    make_endpoint("three")
    a = admit_ticket(endpoint="three", input={"n": "a"}).ticket
    b = admit_ticket(endpoint="three", input={"n": "b"}).ticket
    started = runtime.start_turn(ticket_id=b.id)  # b's message arrived first
    assert started.ticket.id == a.id  # FIFO: the oldest runs
    assert marked("three") == [b.id]
    succeed(started)
    assert queued_tasks("turns")[-1] == ("endpoints.run_ticket", [str(b.id)])


def test_a_release_with_nothing_marked_publishes_nothing(make_endpoint):
    purge_broker()
    make_endpoint("four")
    a = admit_ticket(endpoint="four", input={}).ticket
    runtime.run_ticket(ticket_id=a.id)
    assert broker_queue_length("turns") == 1  # only a's own admission message
