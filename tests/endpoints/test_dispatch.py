"""One broker message per turn, and no ticket left behind: admission marks
every new ticket as owing a dispatch; the dispatcher's pass
(``runtime.dispatch_owed``, called here in place of the dispatcher thread)
publishes the oldest owed ticket of each free endpoint; a ticket whose
message is used up without starting it is marked again, and the next release
publishes the oldest marked one. Real PostgreSQL and real Redis (no worker:
the queue is counted)."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from runtime.services import cancel_ticket
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
    assert queued_tasks("turns")[-1] == ("runtime.run_ticket", [str(queued[0].id)])
    assert broker_queue_length("turns") == 2
    assert marked("one") == [queued[1].id, queued[2].id]
    for ticket in queued:  # the chain: each release publishes the next
        assert runtime.run_ticket(ticket_id=ticket.id) is not None
    assert broker_queue_length("turns") == 4  # one message per turn
    states = set(Ticket.objects.filter(endpoint__address="one").values_list("state", flat=True))
    assert states == {"succeeded"}


def test_a_release_and_the_next_pass_publish_one_message_for_the_oldest_marked_ticket(
    make_endpoint,
):
    purge_broker()
    make_endpoint("two")
    a = admit_ticket(endpoint="two", input={"n": "a"}).ticket
    b = admit_ticket(endpoint="two", input={"n": "b"}).ticket
    c = admit_ticket(endpoint="two", input={"n": "c"}).ticket
    assert runtime.dispatch_owed() == [a.id]  # one message per free endpoint
    started = runtime.start_turn(ticket_id=a.id)
    succeed(started)  # a's release publishes b, the oldest marked
    assert queued_tasks("turns")[-1] == ("runtime.run_ticket", [str(b.id)])
    assert marked("two") == [c.id]
    assert runtime.dispatch_owed() == []  # b's message is in flight: nothing for c yet
    assert runtime.run_ticket(ticket_id=b.id) is not None  # b's release publishes c
    assert queued_tasks("turns")[-1] == ("runtime.run_ticket", [str(c.id)])
    assert runtime.run_ticket(ticket_id=c.id) is not None
    assert broker_queue_length("turns") == 3  # one message per turn
    states = set(Ticket.objects.filter(endpoint__address="two").values_list("state", flat=True))
    assert states == {"succeeded"}


def test_a_pass_leaves_alone_an_endpoint_whose_oldest_ticket_has_its_message_in_flight(
    make_endpoint,
):
    """Found by bench/turns.py: between a finish's commit and the
    start of the next ticket it published, the endpoint is free and its
    other tickets are marked, so the dispatcher published one of them too.
    That message only bounces (a start takes the oldest ticket): an extra
    message for a good share of tickets under load, and the dispatcher's
    own CPU."""
    purge_broker()
    make_endpoint("seven")
    a = admit_ticket(endpoint="seven", input={"n": "a"}).ticket
    assert runtime.dispatch_owed() == [a.id]
    b = admit_ticket(endpoint="seven", input={"n": "b"}).ticket
    assert runtime.dispatch_owed() == []  # a's message will start a
    assert marked("seven") == [b.id] and broker_queue_length("turns") == 1
    assert runtime.run_ticket(ticket_id=a.id) is not None  # a's release publishes b
    assert runtime.dispatch_owed() == []
    assert queued_tasks("turns") == [
        ("runtime.run_ticket", [str(a.id)]),
        ("runtime.run_ticket", [str(b.id)]),
    ]
    # b's message is in flight: a ticket admitted now waits for b's release,
    # unless b is cancelled meanwhile (it no longer holds the endpoint back).
    c = admit_ticket(endpoint="seven", input={"n": "c"}).ticket
    assert runtime.dispatch_owed() == []
    cancel_ticket(ticket_id=b.id, actor="test", reason="test")
    assert runtime.dispatch_owed() == [c.id]


def test_a_publish_the_broker_refuses_leaves_its_tickets_owed(make_endpoint, monkeypatch):
    """Otherwise the endpoint would wait for the lost-dispatch sweep: the
    unmarked oldest ticket looks like one with a message in flight."""
    import kombu.exceptions

    from config.celery import app

    purge_broker()
    make_endpoint("eight")
    a = admit_ticket(endpoint="eight", input={}).ticket
    real = app.send_task

    def down(*args, **kwargs):
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379")

    monkeypatch.setattr(app, "send_task", down)
    assert runtime.dispatch_owed() == [a.id]  # tried
    assert marked("eight") == [a.id]  # and owed again
    monkeypatch.setattr(app, "send_task", real)
    assert runtime.dispatch_owed() == [a.id]
    assert marked("eight") == [] and broker_queue_length("turns") == 1
    # The same for a release's publish of the next ticket.
    b = admit_ticket(endpoint="eight", input={}).ticket
    started = runtime.start_turn(ticket_id=a.id)
    monkeypatch.setattr(app, "send_task", down)
    succeed(started)
    assert marked("eight") == [b.id]
    monkeypatch.setattr(app, "send_task", real)
    assert runtime.dispatch_owed() == [b.id]


def test_a_message_that_starts_an_older_ticket_marks_its_own(make_endpoint):
    purge_broker()
    make_endpoint("three")
    a = admit_ticket(endpoint="three", input={"n": "a"}).ticket
    b = admit_ticket(endpoint="three", input={"n": "b"}).ticket
    started = runtime.start_turn(ticket_id=b.id)  # b's message arrived first
    assert started.ticket.id == a.id  # FIFO: the oldest runs
    assert marked("three") == [b.id]
    succeed(started)
    assert queued_tasks("turns")[-1] == ("runtime.run_ticket", [str(b.id)])


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
