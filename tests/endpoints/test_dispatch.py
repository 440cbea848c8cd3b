"""One broker message per turn, and no ticket left behind: admission marks
every new ticket as owing a dispatch; the dispatcher's pass
(``runtime.dispatch_owed``, called here in place of the dispatcher thread)
publishes the oldest owed ticket of each free endpoint; a ticket whose
message is used up without starting it is marked again, and the next release
publishes the oldest marked one. Real PostgreSQL and real Redis (no worker:
the queue is counted)."""

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
    assert broker_queue_length("turns") == 0  # admission never publishes
    assert marked("one") == [first.id]
    assert runtime.dispatch_owed() == [first.id]
    assert broker_queue_length("turns") == 1
    assert runtime.dispatch_owed() == []  # unmarked: nothing owed twice
    started = runtime.start_turn(ticket_id=first.id)  # as the worker would
    assert started is not None
    queued = [admit_ticket(endpoint="one", input={"n": i}).ticket for i in (1, 2, 3)]
    assert runtime.dispatch_owed() == []  # the lock is held: the release will publish
    assert broker_queue_length("turns") == 1
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
    # Each admitted and dispatched while the lock is free: three messages.
    a = admit_ticket(endpoint="two", input={"n": "a"}).ticket
    assert runtime.dispatch_owed() == [a.id]
    b = admit_ticket(endpoint="two", input={"n": "b"}).ticket
    assert runtime.dispatch_owed() == [b.id]
    c = admit_ticket(endpoint="two", input={"n": "c"}).ticket
    assert runtime.dispatch_owed() == [c.id]
    assert broker_queue_length("turns") == 3
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
    assert runtime.dispatch_owed() == [a.id]
    runtime.run_ticket(ticket_id=a.id)
    assert runtime.dispatch_owed() == []
    assert broker_queue_length("turns") == 1  # only a's own message


def test_one_pass_publishes_one_owed_ticket_per_free_endpoint(make_endpoint):
    purge_broker()
    make_endpoint("five")
    make_endpoint("six")
    five = [admit_ticket(endpoint="five", input={"n": i}).ticket for i in range(3)]
    six = admit_ticket(endpoint="six", input={}).ticket
    assert sorted(runtime.dispatch_owed()) == sorted([five[0].id, six.id])
    assert marked("five") == [five[1].id, five[2].id]
    assert broker_queue_length("turns") == 2
