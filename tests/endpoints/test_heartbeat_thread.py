"""One heartbeat thread per worker process beats every turn the process runs
(runtime/turns/heartbeats.py): a turn costs no thread of its own, each
turn still beats on its own interval, a stopped turn beats no more, and an
idle process holds no database session for it. Against the real test
database."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runtime import turns as runtime
from runtime.turns import heartbeats
from tickets.admission import admit_ticket
from tickets.models import Turn

from ..conftest import wait_for


def _heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("heartbeat")]


def _sessions_of_this_process() -> int:
    """Sessions on this test database other than this thread's (the
    heartbeat thread's among them, when it holds one)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_turns_of_one_process_share_one_heartbeat_thread_each_on_its_own_interval(make_endpoint):
    beaters = []
    for i, interval in enumerate((0.1, 0.1, 60.0)):
        make_endpoint(f"hb{i}")
        ticket = admit_ticket(endpoint=f"hb{i}", input={}).ticket
        turn = runtime.start_turn(ticket_id=ticket.id).turn
        beaters.append((turn, Turn.objects.get(id=turn.id).heartbeat_at, interval))
    handles = [heartbeats.Heartbeater(t, iv, threading.Event()) for t, _, iv in beaters]
    for h in handles:
        h.start()
    try:
        assert len(_heartbeat_threads()) == 1
        wait_for(
            lambda: all(
                Turn.objects.get(id=t.id).heartbeat_at > before for t, before, _ in beaters[:2]
            ),
            timeout=10,
            message="both short-interval turns beat",
        )
        # The turn whose interval is a minute has not beaten yet.
        slow, slow_before, _ = beaters[2]
        assert Turn.objects.get(id=slow.id).heartbeat_at == slow_before
    finally:
        for h in handles:
            h.stop()
    # Stopped: no more beats. A beat under way when stop ran may still land;
    # the thread closes its session once it has, and then sleeps with nothing
    # scheduled, until a turn is added.
    thread = heartbeats._thread()
    wait_for(
        lambda: not thread._connected and thread._wake_at == float("inf"),
        timeout=10,
        message="the heartbeat thread idle, its session closed",
    )
    stopped = {t.id: Turn.objects.get(id=t.id).heartbeat_at for t, _, _ in beaters}
    assert not thread._beats and thread._wake_at == float("inf")
    assert {t.id: Turn.objects.get(id=t.id).heartbeat_at for t, _, _ in beaters} == stopped


@pytest.mark.django_db(transaction=True)
def test_back_to_back_turns_start_no_thread_and_an_idle_process_holds_no_session(make_endpoint):
    make_endpoint("hbseq", path="runtime.demo.sleep", isolation="inline", heartbeat_timeout_s=1)
    before = heartbeats._thread()
    wait_for(lambda: not before._connected, timeout=10, message="an idle heartbeat thread")
    sessions = _sessions_of_this_process()  # other threads' (a live server's, say)
    # A beat every 0.33 s, a turn of 1 s: each turn beats at least once, also
    # when the first beat must open a session on a loaded machine (with 0.5 s
    # turns, a CI run once saw a turn end before its first beat).
    for _ in range(3):
        ticket = admit_ticket(endpoint="hbseq", input={"seconds": 1.0}).ticket
        turn = Turn.objects.get(id=runtime.run_ticket(ticket_id=ticket.id))
        assert turn.heartbeat_at > turn.started_at  # the shared thread beat it
    assert heartbeats._thread() is before and before.is_alive()
    assert len(_heartbeat_threads()) == 1
    # The turns slept past their interval, so the thread opened a session to
    # beat them; with no turn left it closes it.
    wait_for(
        lambda: not before._connected and _sessions_of_this_process() == sessions,
        timeout=10,
        message="the idle heartbeat thread closes its database session",
    )


@pytest.mark.django_db(transaction=True)
def test_an_interrupt_reaches_the_runner_through_the_shared_thread(make_endpoint):
    make_endpoint("hbint")
    ticket = admit_ticket(endpoint="hbint", input={}).ticket
    turn = runtime.start_turn(ticket_id=ticket.id).turn
    interrupt = threading.Event()
    beater = heartbeats.Heartbeater(turn, 0.1, interrupt)
    beater.start()
    try:
        runtime.request_interrupt(turn_id=turn.id, reason="test", actor="test")
        assert interrupt.wait(5), "the heartbeat thread raised the runner's interrupt flag"
    finally:
        beater.stop()


def test_the_heartbeat_thread_leaves_process_signals_to_the_main_thread():
    """An idle pool process waits in the pool's queue lock; a SIGTERM the
    kernel handed to the heartbeat thread instead would not wake it, and the
    worker's warm shutdown would hang (tests/test_embedded.py, under load)."""
    import signal
    from pathlib import Path

    thread = heartbeats._thread()
    status = Path(f"/proc/self/task/{thread.native_id}/status")
    wait_for(
        lambda: (
            int(
                next(
                    line for line in status.read_text().splitlines() if line.startswith("SigBlk:")
                ).split()[1],
                16,
            )
            & (1 << (signal.SIGTERM - 1))
        ),
        timeout=5,
        message="SIGTERM blocked in the heartbeat thread",
    )
