"""The dispatcher's pass runs on its own listening session (prepared there
once, whatever pooler stands in front of Django's connection), and a
notification that arrives while that statement runs is not lost: psycopg
keeps it for the next wait. A real dispatcher thread and real LISTEN against
PostgreSQL; the broker's publish is recorded instead."""

from __future__ import annotations

import threading
from unittest import mock

import psycopg
import pytest
from django.db import connection

from runtime.dispatcher import Dispatcher
from tests.conftest import wait_for
from tickets.admission import admit_ticket

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKED_PASS = """
SELECT application_name FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
  AND query LIKE '%%WITH RECURSIVE waiting%%'
"""


def test_a_pass_runs_on_the_listening_session_and_keeps_what_arrives_meanwhile(
    make_endpoint, settings
):
    settings.DISPATCHER_MIN_GAP_S = 0.0
    settings.DISPATCHER_POLL_S = 600.0  # only notifications wake it
    x, y = make_endpoint("session-x"), make_endpoint("session-y")
    published: list[str] = []
    lock = threading.Lock()

    def send_task(name, args=None, **kw):
        with lock:
            published.append(args[0])

    dispatcher = Dispatcher(name="session")
    holder = psycopg.connect(**connection.get_connection_params())
    with mock.patch("config.celery.app.send_task", side_effect=send_task):
        dispatcher.start()
        try:
            assert dispatcher.listening.wait(20), "the dispatcher to LISTEN"
            wait_for(lambda: dispatcher.rounds >= 1, message="its first pass")

            # x's lock row held elsewhere: the pass that x's admission wakes
            # waits on it (FOR UPDATE), mid-statement.
            holder.execute(
                "SELECT 1 FROM runtime_endpointlock WHERE endpoint_id = %s FOR UPDATE", [x.id]
            )
            first = str(admit_ticket(endpoint=x.address, input={}).ticket.id)
            with psycopg.connect(**connection.get_connection_params(), autocommit=True) as mon:
                waiting = wait_for(
                    lambda: mon.execute(BLOCKED_PASS).fetchall(), message="the pass to wait"
                )
            assert waiting == [("claimcheck dispatcher",)], waiting

            # y admitted while that statement waits: its snapshot cannot see
            # y's ticket, and the notification reaches the session meanwhile.
            second = str(admit_ticket(endpoint=y.address, input={}).ticket.id)
            holder.rollback()
            wait_for(lambda: first in published, message="x's ticket published")
            # The next pass comes from the kept notification (the poll is ten
            # minutes away).
            wait_for(lambda: second in published, timeout=30, message="y's ticket published")
            assert published == [first, second]
        finally:
            holder.close()
            dispatcher.stop()
            dispatcher.join(timeout=10)


@pytest.mark.parametrize(
    ("listen_url", "prepared_calls", "plans"),
    [
        ("direct", False, [(3,)]),  # the listening session is its own: prepared
        ("", True, [(3,)]),  # Django's connection keeps its session, so does this one
        ("", False, []),  # it may go through a transaction pooler: not prepared
    ],
)
def test_the_pass_is_prepared_on_a_session_that_keeps_its_server(
    make_endpoint, settings, listen_url, prepared_calls, plans
):
    """Planned once per session: with many endpoints queued, planning the
    pass costs more than running it, and the dispatcher runs it after
    every wake-up. The session is
    made as the dispatcher makes its own (Django's connection parameters,
    whose cursor binds on the client and would prepare nothing), and is
    prepared on only where it is known to keep its server session."""
    from core.listen import connect_listener, listen_params
    from runtime.turns import dispatch_owed

    make_endpoint("session-prepared")
    session = connect_listener(listen_params("claimcheck dispatcher"))
    # Only whether it is set counts here; the session above is already made.
    settings.DATABASE_LISTEN_URL = "postgres://127.0.0.1/x" if listen_url else ""
    settings.DATABASE_PREPARED_CALLS = prepared_calls
    try:
        with mock.patch("config.celery.app.send_task"):
            for _ in range(3):
                dispatch_owed(session=session)
        found = session.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%WITH RECURSIVE waiting%%'"
        ).fetchall()
    finally:
        session.close()
    assert found == plans, found
