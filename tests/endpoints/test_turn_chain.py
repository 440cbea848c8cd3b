"""A worker process runs an endpoint's backlog without a broker round trip
per ticket (runtime.turns.run_ticket with ``keep_going``): each finish
hands the next ticket back, the process starts it, and what it does not
start it publishes. Real PostgreSQL and the real Redis broker."""

from __future__ import annotations

import pytest

from core.dispatch import RUN_TICKET
from runtime import turns as runtime
from runtime.models import Turn
from tests.conftest import purge_broker, queued_tasks
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)


def _backlog(make_endpoint, address: str, n: int) -> list:
    make_endpoint(address, isolation="inline")
    return [admit_ticket(endpoint=address, input={"i": i}).ticket.id for i in range(n)]


def _states(ids) -> list[str]:
    states = dict(Ticket.objects.filter(id__in=ids).values_list("id", "state"))
    return [states[i] for i in ids]


def test_a_backlog_runs_in_one_task_without_a_message_per_ticket(make_endpoint):
    purge_broker()
    ids = _backlog(make_endpoint, "chain.all", 5)
    first = runtime.run_ticket(ticket_id=ids[0], keep_going=lambda: True)
    assert _states(ids) == ["succeeded"] * 5
    assert queued_tasks("turns") == []  # nothing went through the broker
    turns = list(Turn.objects.filter(ticket_id__in=ids).order_by("seq"))
    # One turn per ticket, in admission order, each its own seq and tenure.
    assert [t.ticket_id for t in turns] == ids and first == turns[0].id
    assert [t.seq for t in turns] == list(range(turns[0].seq, turns[0].seq + 5))
    assert all(t.state == "completed" for t in turns)


def test_a_chain_stops_at_its_cap_and_publishes_the_next_ticket(make_endpoint, settings):
    settings.TURN_CHAIN_MAX = 2
    purge_broker()
    ids = _backlog(make_endpoint, "chain.cap", 4)
    runtime.run_ticket(ticket_id=ids[0], keep_going=lambda: True)
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

    runtime.run_ticket(ticket_id=ids[0], keep_going=keep_going)
    assert asked == [True]
    assert _states(ids) == ["succeeded", "queued", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_a_chain_stops_at_its_window(make_endpoint, settings):
    settings.TURN_CHAIN_WINDOW_S = 0  # the first turn already used it up
    purge_broker()
    ids = _backlog(make_endpoint, "chain.window", 2)
    runtime.run_ticket(ticket_id=ids[0], keep_going=lambda: True)
    assert _states(ids) == ["succeeded", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]


def test_without_keep_going_every_next_ticket_goes_through_the_broker(make_endpoint):
    purge_broker()
    ids = _backlog(make_endpoint, "chain.off", 2)
    runtime.run_ticket(ticket_id=ids[0])
    assert _states(ids) == ["succeeded", "queued"]
    assert queued_tasks("turns") == [(RUN_TICKET, [str(ids[1])])]
