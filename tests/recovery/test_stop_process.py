"""The owner's "stop the process" (docs/explanation/design.md, "Reclaiming a slot"): an
inline turn that ignores its interrupt is quarantined and keeps its worker
slot after the case is decided; the owner's stop, recorded with a rationale,
is carried out by the worker on that host against the recorded pid, the slot
is free and the exit is late evidence on the case. Real workers and beat."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from recovery import services
from recovery.models import CaseEvidence, ProcessStop, RecoveryCase
from runtime import registry
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = [pytest.mark.django_db(transaction=True)]


def _slots(api) -> list[dict]:
    body = api.get("/workers").json()
    return [s for w in body["workers"] if w["name"].startswith("turns@") for s in w["slots"]]


def test_stop_process_needs_a_decided_case_held_slot_and_an_owner(
    quarantine, owner_api, outsider_api
):
    q = quarantine()
    case_id = str(q.case.id)
    body = {"rationale": "free the slot"}
    assert outsider_api.post(f"/recovery/cases/{case_id}/stop-process", body).status_code == 404
    open_case = owner_api.post(f"/recovery/cases/{case_id}/stop-process", body)
    assert open_case.status_code == 409, open_case.content
    assert not ProcessStop.objects.exists()


@pytest.mark.integration
def test_the_owner_stops_the_process_of_a_decided_inline_turn(
    celery_procs, make_endpoint, owner, api, owner_api, client
):
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint(
        "stop.stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        turn_budget_s=1,
        interrupt_grace_s=0.5,
    )
    make_endpoint("stop.echo")
    stuck = admit_ticket(endpoint="stop.stuck", input={"seconds": 300}).ticket
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=stuck).first(), timeout=20, message="quarantine"
    )
    inspection = owner_api.post(f"/recovery/cases/{case.id}/inspections").json()
    decided = owner_api.post(
        f"/recovery/cases/{case.id}/decisions",
        {"action": "finalize_orphan", "inspection": inspection["id"], "rationale": "give up"},
    )
    assert decided.status_code == 201, decided.content
    # Decided, but the callable still occupies the only slot: held.
    (slot,) = _slots(api)
    assert slot["status"] == "held" and slot["turn"]["id"] == str(case.turn_id)
    echo = admit_ticket(endpoint="stop.echo", input={}).ticket
    # Every slot is busy (the only one): the next ticket waits behind it; the
    # stop must reach that worker anyway, and then the ticket runs.
    client.force_login(owner)
    page = client.get(f"/recovery/{case.id}/").content.decode()
    assert "Stop the process" in page and str(slot["pid"]) in page

    requested = time.monotonic()
    resp = owner_api.post(
        f"/recovery/cases/{case.id}/stop-process", {"rationale": "the callable never returns"}
    )
    assert resp.status_code == 201, resp.content
    stop = resp.json()
    assert stop["pid"] == slot["pid"] and stop["outcome"] == "requested"
    ev = wait_for(
        lambda: CaseEvidence.objects.filter(case=case, kind="late_process_exit").first(),
        timeout=20,
        message="the exit as late evidence",
    )
    # The control command runs in the worker's main process, which reads
    # its broadcasts whether or not a pool slot is free.
    assert time.monotonic() - requested < 10
    assert ev.detail["pid"] == slot["pid"] and ev.detail["signal"] == "SIGKILL"
    assert ProcessStop.objects.get(id=stop["id"]).outcome == "killed"
    # The slot is free: the next ticket runs.
    wait_for(
        lambda: Ticket.objects.get(id=echo.id).state == "succeeded",
        timeout=30,
        message="the next ticket on the freed slot",
    )
    assert Ticket.objects.filter(id=echo.id, state="succeeded").exists()
    kinds = list(Ticket.objects.get(id=stuck.id).events.values_list("kind", flat=True))
    assert "process_stop_requested" in kinds
    # A deliberate act is no alert: the pool's lines about the process it
    # lost are WARNING naming the owner's decision, with no traceback.
    decision = decided.json()["id"]

    def lost_lines() -> list[str]:
        log = celery_procs.log("turns").decode(errors="replace")
        return [line for line in log.splitlines() if "WorkerLostError" in line]

    lines = wait_for(lost_lines, timeout=20, message="the pool's line about the lost process")
    assert all(" WARNING " in line and decision in line for line in lines), lines
    log = celery_procs.log("turns").decode(errors="replace")
    assert "Traceback" not in log
    assert not [line for line in log.splitlines() if " ERROR " in line and "exited" in line]


def _decided(owner_api, case_id) -> None:
    inspection = owner_api.post(f"/recovery/cases/{case_id}/inspections").json()
    decided = owner_api.post(
        f"/recovery/cases/{case_id}/decisions",
        {"action": "finalize_orphan", "inspection": inspection["id"], "rationale": "give up"},
    )
    assert decided.status_code == 201, decided.content


@pytest.mark.parametrize("what", ["restarted", "lost", "slot_moved_on", "no_report"])
def test_a_stop_no_worker_will_carry_out_is_closed_with_its_reason(
    what, quarantine, owner_api, settings, monkeypatch
):
    """The worker registry's own writes stand in for a worker here: the
    named worker (not running) registers, its slot runs the turn; the stop's
    broadcast reaches nobody. The budget sweep's resolver closes it."""
    q = quarantine()
    _decided(owner_api, q.case.id)
    node = f"gone-{what}@{socket.gethostname()}"
    registry.register_worker(
        name=node, host=socket.gethostname(), pid=os.getpid(), queues=["turns"], pool_size=1
    )
    registry.set_node(node)
    try:
        registry.slot_busy(q.turn.id)
        resp = owner_api.post(f"/recovery/cases/{q.case.id}/stop-process", {"rationale": "free"})
        assert resp.status_code == 201, resp.content
        stop_id = resp.json()["id"]
        assert services.resolve_stale_stops() == []  # the worker may still report

        if what == "restarted":
            registry.register_worker(
                name=node, host=socket.gethostname(), pid=1, queues=["turns"], pool_size=1
            )
        elif what == "lost":
            settings.WORKER_LOST_AFTER_S = 0
        elif what == "slot_moved_on":
            registry.slot_idle()
            monkeypatch.setattr(services, "PROCESS_STOP_REPORT_GRACE_S", 0)
        else:
            settings.PROCESS_STOP_TIMEOUT_S = 0
    finally:
        registry.set_node("")
    assert [str(s) for s in services.resolve_stale_stops()] == [stop_id]
    stop = ProcessStop.objects.get(id=stop_id)
    expected = {
        "restarted": ("unreachable", "restarted"),
        "lost": ("unreachable", "lost"),
        "slot_moved_on": ("gone", "no longer runs the turn"),
        "no_report": ("unreachable", "no report"),
    }[what]
    assert stop.outcome == expected[0] and expected[1] in stop.exit["reason"], stop.exit
    assert stop.done_at is not None
    event = q.ticket.events.get(kind="process_stop_resolved")
    assert event.detail["outcome"] == expected[0] and event.detail["stop"] == stop_id
    assert services.resolve_stale_stops() == []  # closed once


@pytest.mark.integration
def test_a_stop_sent_to_a_worker_that_then_restarts_is_closed_as_unreachable(
    celery_procs, make_endpoint, owner, owner_api
):
    """The issue's case: the request was sent while the worker was down, and
    the worker came back under its name; before, it stayed "requested"."""
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint(
        "restart.stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        turn_budget_s=1,
        interrupt_grace_s=0.5,
    )
    stuck = admit_ticket(endpoint="restart.stuck", input={"seconds": 300}).ticket
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=stuck).first(), timeout=20, message="quarantine"
    )
    _decided(owner_api, case.id)
    celery_procs.kill("turns", signal.SIGKILL)  # its pool process with it
    resp = owner_api.post(f"/recovery/cases/{case.id}/stop-process", {"rationale": "free it"})
    assert resp.status_code == 201 and resp.json()["outcome"] == "requested", resp.content
    celery_procs.worker("turns", queues="turns", concurrency=1)
    stop = wait_for(
        lambda: (
            ProcessStop.objects.exclude(outcome="requested").filter(id=resp.json()["id"]).first()
        ),
        timeout=20,
        message="the stop to be resolved",
    )
    assert stop.outcome == "unreachable" and "restarted" in stop.exit["reason"], stop.exit
