"""The worker registry (GET /api/v1/workers, /workers): slots held by a
quarantined inline turn, endpoints starved while every slot is busy, a lost
worker. Real workers and beat."""

from __future__ import annotations

import signal

import pytest

from endpoints.models import Turn
from recovery.models import RecoveryCase
from tests.conftest import wait_for
from tickets.admission import admit_ticket

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


@pytest.mark.integration
def test_a_held_slot_a_starved_endpoint_and_a_lost_worker_are_shown(
    celery_procs, make_endpoint, api, settings, staff_user, client
):
    settings.WORKER_LOST_AFTER_S = 3
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    wait_for(lambda: _turns_worker(api), timeout=20, message="the turns worker to register")
    w = _turns_worker(api)
    assert w["status"] == "alive" and w["pool_size"] == 1 and w["queues"] == ["turns"]

    make_endpoint("reg.stuck", path="endpoints.demo.stuck", turn_budget_s=1, interrupt_grace_s=0.5)
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
