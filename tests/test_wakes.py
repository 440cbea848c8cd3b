"""Wake-ups follow the commit (core/wakes.py): no write transaction of an
admission, a turn's start or its finish sends NOTIFY, and the listeners
still hear of each of them, from another session, after the commit.

The proof is PostgreSQL's own: a notification carries the process id of
the backend that sent it. Every notification a LISTEN session receives
here must come from a session other than the one that wrote the ledger.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from core.dispatch import DISPATCH_CHANNEL
from core.listen import listen_params
from core.wakes import waker
from runtime import turns as runtime
from runtime.runners import Outcome
from tickets.admission import admit_ticket
from tickets.waits import TICKET_CHANNEL

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener():
    conn = psycopg.connect(**listen_params("test wakes"), autocommit=True)
    conn.execute(f"LISTEN {TICKET_CHANNEL}")
    conn.execute(f"LISTEN {DISPATCH_CHANNEL}")
    yield conn
    conn.close()


def _heard(conn, want: set[tuple[str, str]], timeout: float = 30.0) -> list:
    """Notifications until every (channel, payload) of ``want`` arrived."""
    got = []
    deadline = time.monotonic() + timeout
    while not want <= {(n.channel, n.payload) for n in got}:
        left = deadline - time.monotonic()
        assert left > 0, f"never heard {want - {(n.channel, n.payload) for n in got}}"
        got.extend(conn.notifies(timeout=min(left, 1.0), stop_after=1))
    return got


def _writer_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def test_no_ledger_function_sends_notify():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT proname FROM pg_proc WHERE proname LIKE 'claimcheck%%'"
            " AND prosrc ~* '(pg_notify|\\mnotify\\M)'"
        )
        assert cur.fetchall() == []


def test_admission_start_and_finish_wake_from_outside_their_transactions(make_endpoint, listener):
    make_endpoint("wakes.one")
    writer = _writer_pid()

    ticket = admit_ticket(endpoint="wakes.one", input={"x": 1}).ticket
    heard = _heard(listener, {(DISPATCH_CHANNEL, "")})

    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    heard += _heard(listener, {(TICKET_CHANNEL, str(ticket.id))})

    done = runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({"ok": True}),
        source="worker",
    )
    assert done.accepted
    # The finish wakes the ticket's watchers and, the lock released with
    # nothing left to publish, the dispatcher.
    heard += _heard(listener, {(TICKET_CHANNEL, str(ticket.id)), (DISPATCH_CHANNEL, "")})

    assert _writer_pid() == writer  # one session wrote all three
    senders = {n.pid for n in heard}
    assert writer not in senders, "a notification was sent inside a write transaction"


def test_a_lost_wake_costs_latency_not_the_ticket(make_endpoint, listener):
    """With the waker off, nothing is heard, and the dispatcher's poll
    (the sweep behind every wake) still finds the ticket owed: the ledger,
    not the wake, is the truth."""
    from runtime.turns.dispatch import dispatch_owed

    make_endpoint("wakes.lost")
    w = waker()
    w.enabled = False
    try:
        ticket = admit_ticket(endpoint="wakes.lost", input={"x": 1}).ticket
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    finally:
        w.enabled = True
    # The dispatcher's pass (what its poll runs) publishes it all the same.
    assert ticket.id in dispatch_owed()
