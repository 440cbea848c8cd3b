"""``wait_s`` and the console's live regions wake on the NOTIFY of a
ticket's events: a waiting request costs no queries
while it waits. Real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from runtime import turns as runtime
from tests.conftest import listener_wakeups, wait_for, waiting_on
from tickets import selectors, waits
from tickets.admission import admit_ticket
from tickets.api import wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_listener():
    yield
    waits.stop_listener()  # its session would keep the test database from being dropped


def test_a_waiter_is_woken_by_the_terminal_transition_without_polling(make_endpoint):
    make_endpoint("waited")
    ticket = admit_ticket(endpoint="waited", input={}).ticket
    result: dict = {}
    statements = []

    def waiter():
        def count(execute, sql, params, many, context):
            statements.append(sql)
            return execute(sql, params, many, context)

        try:
            loaded = selectors.get_ticket(ticket.id)
            with connection.execute_wrapper(count):
                result["ticket"] = wait_for_terminal(loaded, 60)
            result["statements"] = len(statements)
        finally:
            connections.close_all()

    with CaptureQueriesContext(connection) as one_load:
        selectors.get_ticket(ticket.id)
    per_load = len(one_load.captured_queries)
    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(
        lambda: waiting_on(str(ticket.id)) and len(statements) >= per_load,
        message="the waiter to subscribe and read",
    )
    read = len(statements)
    # Subscribed on the listener (not the fallback poll), it waits on: commits
    # of other tickets' events, each handed on by the listener, cost it no read.
    listener_wakeups(20)
    assert thread.is_alive() and len(statements) == read, (len(statements), read)
    runtime.run_ticket(ticket_id=ticket.id)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the waiter was not woken by the terminal transition"
    assert result["ticket"].state == "succeeded"
    # Read when subscribed and once per commit that wrote the ticket an event
    # (the turn's start and its finish; the first load is the caller's).
    assert result["statements"] <= 3 * per_load, (result["statements"], per_load)


def test_a_waiter_returns_the_ticket_as_it_is_when_the_time_is_up(make_endpoint):
    make_endpoint("unwaited")
    ticket = admit_ticket(endpoint="unwaited", input={}).ticket
    waited = wait_for_terminal(selectors.get_ticket(ticket.id), 0.3)
    assert waited.state == "queued"
