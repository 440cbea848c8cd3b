"""The worker registry (GET /api/v1/workers, /workers): slots held by a
quarantined inline turn, endpoints starved while every slot is busy, a lost
worker. Real workers and beat."""

from __future__ import annotations

import signal

import pytest

from recovery.models import RecoveryCase
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Turn

pytestmark = [pytest.mark.django_db(transaction=True)]


def _turns_worker(api) -> dict | None:
    body = api.get("/workers").json()
    return next((w for w in body["workers"] if w["name"].startswith("turns@")), None)


def test_workers_route_is_staff_only(api, django_user_model, client):
    from accounts.keys import create_api_key

    django_user_model.objects.create_user("plain", password="pw")
    _, key = create_api_key(username="plain")
    assert api.as_key(key).get("/workers").status_code == 403
    body = api.get("/workers").json()
    assert body == {"workers": [], "held_turns": [], "starved_endpoints": []}
    client.force_login(django_user_model.objects.get(username="plain"))
    assert client.get("/workers/").status_code == 404


def _slot(name: str) -> dict:
    from runtime.selectors import workers_overview

    (worker,) = [w for w in workers_overview()["workers"] if w["name"] == name]
    (slot,) = worker["slots"]
    return slot


def test_a_slots_turn_is_the_ledgers_record_of_its_start_and_finish(make_endpoint):
    """The turn's start names the pool process on the turn and the finish
    that process sends lets go of it, each in its one statement: the
    registry reads which turn a slot runs from the ledger (running, held
    after a finish another process sent, idle once let go, let go with a
    process that is gone), and the check before a kill reads the same."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from core.times import iso
    from runtime import registry
    from runtime import turns as runtime
    from runtime.runners import Outcome
    from runtime.selectors import slot_holding, slot_runs

    node = "turns@slots"
    registry.register_worker(name=node, host="h", pid=1, queues=["turns"], pool_size=1)
    registry.set_node(node)
    try:
        registry.slot_seen()  # a pool process's row, made at its first turn task
        slot = registry.current_slot()
        pid = slot[1]
        assert _slot(node)["status"] == "idle"
        make_endpoint("slot.echo")

        def start():
            ticket = admit_ticket(endpoint="slot.echo", input={}).ticket
            with CaptureQueriesContext(connection) as q:
                started = runtime.start_turn(ticket_id=ticket.id, slot=slot)
            assert len(q.captured_queries) == 1 and started.slot_recorded
            return started

        started = start()
        shown = _slot(node)
        assert shown["status"] == "running" and shown["turn"]["id"] == str(started.turn.id)
        assert shown["since"] == iso(started.turn.started_at)
        assert slot_runs(node, pid, started.turn.id)
        assert not slot_runs(node, pid + 1, started.turn.id)
        assert slot_holding(started.turn.id).pid == pid

        with CaptureQueriesContext(connection) as q:
            done = runtime.finish_turn(
                turn_id=started.turn.id,
                seq=started.turn.seq,
                outcome=Outcome.success({}),
                source="worker",
                turn=started.turn,
                slot=slot,
            )
        assert len(q.captured_queries) == 1 and done.accepted and done.slot_recorded
        released = Turn.objects.get(id=started.turn.id).released_at
        assert released is not None
        assert _slot(node) | {"since": None} == {
            "pid": pid,
            "child_pid": None,
            "status": "idle",
            "turn": None,
            "since": None,
        }
        assert _slot(node)["since"] == iso(released)
        assert not slot_runs(node, pid, started.turn.id) and slot_holding(started.turn.id) is None

        # Finished by another process (the API, a sweep) while the callable
        # still runs in this one: held, until this process lets go.
        other = start()
        runtime.finish_turn(
            turn_id=other.turn.id, seq=other.turn.seq, outcome=Outcome.success({}), source="api"
        )
        shown = _slot(node)
        assert shown["status"] == "held" and shown["turn"]["id"] == str(other.turn.id)
        assert slot_runs(node, pid, other.turn.id)
        registry.slot_idle()
        assert _slot(node)["status"] == "idle" and not slot_runs(node, pid, other.turn.id)

        # The process gone (the main process's heartbeat lists the pool): its
        # row goes, and its turn is let go, so a process that later gets its
        # pid runs nothing.
        third = start()
        assert slot_runs(node, pid, third.turn.id)
        registry.sync_slots(node, [pid + 1])
        assert not slot_runs(node, pid, third.turn.id)
        assert Turn.objects.get(id=third.turn.id).released_at is not None
        assert (_slot(node)["pid"], _slot(node)["status"]) == (pid + 1, "idle")
    finally:
        registry.set_node("")


@pytest.mark.integration
def test_a_held_slot_a_starved_endpoint_and_a_lost_worker_are_shown(
    celery_procs, make_endpoint, api, settings, staff_user, client
):
    settings.WORKER_LOST_AFTER_S = 3
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    wait_for(lambda: _turns_worker(api), timeout=60, message="the turns worker to register")
    w = _turns_worker(api)
    assert w["status"] == "alive" and w["pool_size"] == 1 and w["queues"] == ["turns"]

    make_endpoint("reg.stuck", path="runtime.demo.stuck", turn_budget_s=1, interrupt_grace_s=0.5)
    make_endpoint("reg.echo")
    stuck = admit_ticket(endpoint="reg.stuck", input={"seconds": 60}).ticket
    wait_for(
        lambda: RecoveryCase.objects.filter(ticket=stuck).exists(),
        timeout=20,
        message="quarantine",
    )
    turn = Turn.objects.get(ticket=stuck)
    echo = admit_ticket(endpoint="reg.echo", input={}).ticket
    body = wait_for(
        lambda: (b := api.get("/workers").json())["starved_endpoints"] and b,
        timeout=10,
        message="the starved endpoint",
    )
    assert body["held_turns"] == [str(turn.id)]
    assert body["starved_endpoints"] == ["reg.echo"]
    (slot,) = _turns_worker(api)["slots"]
    assert slot["status"] == "held" and slot["turn"]["id"] == str(turn.id)
    assert slot["turn"]["ticket_state"] == "recovering"

    client.force_login(staff_user)
    html = client.get("/workers/").content.decode()
    assert 'data-status="held"' in html and 'data-flag="starved"' in html

    celery_procs.kill("turns", sig=signal.SIGKILL)
    wait_for(lambda: _turns_worker(api)["status"] == "lost", timeout=15, message="the worker lost")
    assert Turn.objects.get(id=turn.id).state == "uncertain"  # no replay
    assert echo.id  # still queued: nobody runs it


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.integration
def test_isolated_turns_run_in_the_slots_warm_process_shown_beside_the_slot(
    celery_procs, make_endpoint, api, staff_user, client
):
    """One turn process per slot, kept between turns; the workers page shows
    it as the process running an isolated turn; after a kill the next turn
    gets a fresh one (runtime/isolation.py)."""
    from tickets.models import Ticket

    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    wait_for(lambda: _turns_worker(api), timeout=60, message="the turns worker to register")
    make_endpoint("warm.where", path="tests.endpoints.warm_runners.where")
    make_endpoint("warm.nap", path="runtime.demo.sleep")
    make_endpoint(
        "warm.stubborn",
        runner={"kind": "python", "path": "runtime.demo.stubborn", "kill_after_s": 0.5},
        turn_budget_s=1,
        interrupt_grace_s=1,
    )

    def where() -> int:
        t = admit_ticket(endpoint="warm.where", input={}).ticket
        wait_for(
            lambda: Ticket.objects.get(id=t.id).state == "succeeded", timeout=30, message="a turn"
        )
        return Ticket.objects.get(id=t.id).result["pid"]

    first = where()
    assert where() == first  # kept between turns

    nap = admit_ticket(endpoint="warm.nap", input={"seconds": 30}).ticket
    slot = wait_for(
        lambda: (s := _turns_worker(api)["slots"]) and s[0]["turn"] and s[0],
        timeout=20,
        message="the nap to show in its slot",
    )
    assert slot["turn"]["ticket"] == str(nap.id) and slot["turn"]["isolated"] is True
    assert slot["turn"]["pid"] == slot["child_pid"] == first != slot["pid"]
    assert _ppid(first) == slot["pid"]
    client.force_login(staff_user)
    assert f'data-turn-pid="{first}"' in client.get("/workers/").content.decode()
    api.post(f"/tickets/{nap.id}/cancel", {})
    wait_for(lambda: Ticket.objects.get(id=nap.id).state != "running", timeout=20, message="stop")
    # Interrupted: that process proved its stop by exiting; the next is new.
    assert Turn.objects.get(ticket=nap).stop_evidence["detail"]["pid"] == first
    second = where()
    assert second != first

    stubborn = admit_ticket(endpoint="warm.stubborn", input={"seconds": 120}).ticket
    wait_for(
        lambda: Ticket.objects.get(id=stubborn.id).state == "failed",
        timeout=25,
        message="the escalation",
    )
    ev = Turn.objects.get(ticket=stubborn).stop_evidence
    assert ev["kind"] == "process_exit" and ev["detail"]["signal"] == "SIGKILL"
    assert ev["detail"]["pid"] == second
    fresh = where()
    assert fresh not in (first, second)
    (slot,) = _turns_worker(api)["slots"]
    assert slot["child_pid"] == fresh
