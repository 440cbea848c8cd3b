"""A worker process runs an endpoint's backlog without a broker round trip
or a commit of its own per ticket (runtime.turns.run_ticket with
``keep_going``): each finish starts the endpoint's next turn in its own
transaction and the process runs it; the next ticket it does not start, it
publishes. Real PostgreSQL and the real Redis broker."""

from __future__ import annotations

import pytest

from core.dispatch import RUN_TICKET
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import purge_broker, queued_tasks
from tests.endpoints.chains import started_in_a_finish
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn
from tickets.turns.start import turn_token_sha256

pytestmark = pytest.mark.django_db(transaction=True)


def _backlog(make_endpoint, address: str, n: int) -> list:
    make_endpoint(address, isolation="inline")
    return [admit_ticket(endpoint=address, input={"i": i}).ticket.id for i in range(n)]


def _finishing(started, task: str) -> dict:
    """A worker's finish of ``started`` that starts the endpoint's next turn."""
    return dict(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({"i": 0}),
        source="worker",
        start_next=True,
        celery_task_id=task,
    )


def _states(ids) -> list[str]:
    states = dict(Ticket.objects.filter(id__in=ids).values_list("id", "state"))
    return [states[i] for i in ids]


def test_a_backlog_runs_in_one_task_without_a_message_per_ticket(make_endpoint):
    purge_broker()
    ids = _backlog(make_endpoint, "chain.all", 5)
    first = runtime.run_ticket(ticket_id=ids[0], celery_task_id="task", keep_going=lambda: True)
    assert _states(ids) == ["succeeded"] * 5
    assert queued_tasks("turns") == []  # nothing went through the broker
    turns = list(Turn.objects.filter(ticket_id__in=ids).order_by("seq"))
    # One turn per ticket, in admission order, each its own seq and tenure.
    assert [t.ticket_id for t in turns] == ids and first == turns[0].id
    assert [t.seq for t in turns] == list(range(turns[0].seq, turns[0].seq + 5))
    assert all(t.state == "completed" for t in turns)
    # Each next turn was started by the finish of the one before it, in its
    # transaction: one commit per ticket.
    assert started_in_a_finish(ids) == ids[1:]
    assert {t.celery_task_id for t in turns} == {"task"}


def test_a_chain_stops_at_its_cap_and_publishes_the_next_ticket(make_endpoint, settings):
    settings.TURN_CHAIN_MAX = 2
    purge_broker()
    ids = _backlog(make_endpoint, "chain.cap", 4)
    runtime.run_ticket(ticket_id=ids[0], celery_task_id="task", keep_going=lambda: True)
    assert _states(ids) == ["succeeded", "succeeded", "queued", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[2])])]
    # The published ticket is unmarked (its message is in flight); the one
    # behind it stays owed to the dispatcher.
    marks = dict(Ticket.objects.filter(id__in=ids[2:]).values_list("id", "needs_dispatch"))
    assert marks == {ids[2]: False, ids[3]: True}


def test_a_chain_stops_when_the_worker_shuts_down(make_endpoint):
    purge_broker()
    ids = _backlog(make_endpoint, "chain.stop", 3)
    asked = []

    def keep_going() -> bool:
        asked.append(True)
        return False  # the worker heard SIGTERM during the first turn

    runtime.run_ticket(ticket_id=ids[0], celery_task_id="task", keep_going=keep_going)
    assert asked == [True]
    assert _states(ids) == ["succeeded", "queued", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_a_chain_stops_at_its_window(make_endpoint, settings):
    settings.TURN_CHAIN_WINDOW_S = 0  # the first turn already used it up
    purge_broker()
    ids = _backlog(make_endpoint, "chain.window", 2)
    runtime.run_ticket(ticket_id=ids[0], celery_task_id="task", keep_going=lambda: True)
    assert _states(ids) == ["succeeded", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_without_a_task_id_a_chain_does_not_start(make_endpoint):
    """Nothing could find a started turn again after a lost reply."""
    purge_broker()
    ids = _backlog(make_endpoint, "chain.no-task", 2)
    runtime.run_ticket(ticket_id=ids[0], keep_going=lambda: True)
    assert _states(ids) == ["succeeded", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_without_keep_going_every_next_ticket_goes_through_the_broker(make_endpoint):
    purge_broker()
    ids = _backlog(make_endpoint, "chain.off", 2)
    runtime.run_ticket(ticket_id=ids[0])
    assert _states(ids) == ["succeeded", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_a_chain_stopped_by_its_cap_starts_nothing_in_the_last_finish(make_endpoint, settings):
    settings.TURN_CHAIN_MAX = 2
    ids = _backlog(make_endpoint, "chain.cap-tx", 3)
    runtime.run_ticket(ticket_id=ids[0], celery_task_id="task", keep_going=lambda: True)
    assert started_in_a_finish(ids) == [ids[1]]


def test_a_finish_starts_the_oldest_queued_ticket_and_marks_the_one_it_was_for(make_endpoint):
    """The next ticket a release unmarks is the oldest *marked* one; the
    start in the finish takes the endpoint's oldest queued ticket all the
    same (FIFO), and marks the other again, as a message's start does."""
    purge_broker()
    ids = _backlog(make_endpoint, "chain.fifo", 3)
    started = runtime.start_turn(ticket_id=ids[0], celery_task_id="task-fifo")
    # As if the dispatcher had published ids[1]: unmarked, its message in flight.
    Ticket.objects.filter(id=ids[1]).update(needs_dispatch=False)
    done = runtime.finish_turn(**_finishing(started, "task-fifo"))
    assert done.accepted and done.started is not None
    assert done.started.ticket.id == ids[1] and done.started.ticket.state == "running"
    assert done.started.turn.seq == started.turn.seq + 1
    assert done.started.turn.celery_task_id == "task-fifo"
    assert done.started.turn.token_sha256 == turn_token_sha256(done.started.token)
    assert done.started.endpoint.address == "chain.fifo"
    assert _states(ids) == ["succeeded", "running", "queued"]
    assert Ticket.objects.get(id=ids[2]).needs_dispatch  # owed again, for the next release
    assert queued_tasks("turns") == []
    # ids[1]'s message, when it comes, finds it running: nothing happens.
    assert runtime.start_turn(ticket_id=ids[1]) is None


def test_a_finish_retried_after_a_lost_reply_runs_the_turn_it_started(make_endpoint):
    """The finish committed, and started the next turn, but its reply was
    lost: the retry is a duplicate, and hands this worker the running turn
    the first attempt started (its task id, this process), with a new token."""
    purge_broker()
    ids = _backlog(make_endpoint, "chain.lost", 2)
    started = runtime.start_turn(ticket_id=ids[0], celery_task_id="task-lost")
    finish = _finishing(started, "task-lost")
    first = runtime.finish_turn(**finish)
    again = runtime.finish_turn(**finish)
    assert again.duplicate and again.started is not None
    assert again.started.turn.id == first.started.turn.id
    assert again.started.ticket.id == ids[1]
    assert again.started.token != first.started.token
    turn = Turn.objects.get(id=first.started.turn.id)
    assert turn.state == "running" and turn.token_sha256 == turn_token_sha256(again.started.token)
    assert Turn.objects.filter(ticket_id=ids[1]).count() == 1
    assert queued_tasks("turns") == []
