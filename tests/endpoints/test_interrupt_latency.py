"""A cooperative python runner hears its interrupt through the heartbeat, so
the heartbeat must come more often than the interrupt grace: otherwise a
turn that would stop at once is quarantined (found by the fault suite: a
3 s grace with a 30 s heartbeat timeout, i.e. a beat every 5 s)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runtime import runners
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Turn


def test_the_heartbeat_comes_at_least_twice_per_interrupt_grace():
    assert runners.heartbeat_interval(30, 3) <= 1.5
    assert runners.heartbeat_interval(30, 60) == 5  # the cap
    assert runners.heartbeat_interval(6, 60) == 2  # a third of the timeout
    assert runners.heartbeat_interval(30) == 5


@pytest.mark.django_db(transaction=True)
def test_a_cooperative_turn_stops_within_a_grace_shorter_than_the_heartbeat_timeout(
    make_endpoint,
):
    grace = 3.0
    make_endpoint(
        "latency.sleep",
        path="runtime.demo.sleep",
        heartbeat_timeout_s=30,  # a beat every 5 s unless the grace asks for more
        interrupt_grace_s=grace,
    )
    ticket = admit_ticket(endpoint="latency.sleep", input={"seconds": 60}).ticket

    def run() -> None:
        try:
            runtime.run_ticket(ticket_id=ticket.id)
        finally:
            connection.close()  # this thread's own connection

    worker = threading.Thread(target=run)
    worker.start()
    try:
        turn = wait_for(
            lambda: Turn.objects.filter(ticket_id=ticket.id).first(), message="the turn to start"
        )
        # Interrupt just after a beat: the worst case, a whole interval away
        # from the next one.
        wait_for(
            lambda: Turn.objects.get(id=turn.id).heartbeat_at > turn.started_at,
            timeout=15,
            message="the first heartbeat",
        )
        assert runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="test")
        wait_for(
            lambda: Turn.objects.get(id=turn.id).state == "stopped",
            timeout=grace,
            interval=0.05,
            message="the turn to stop within its interrupt grace",
        )
    finally:
        # Without the fix the runner still stops, a beat later.
        worker.join(timeout=70)
    assert runtime.quarantine_turn(turn_id=turn.id) is None
