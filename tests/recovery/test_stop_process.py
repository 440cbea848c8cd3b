"""The owner's "stop the process" (docs/design.md, "Reclaiming a slot"): an
inline turn that ignores its interrupt is quarantined and keeps its worker
slot after the case is decided; the owner's stop, recorded with a rationale,
is carried out by the worker on that host against the recorded pid, the slot
is free and the exit is late evidence on the case. Real workers and beat."""

from __future__ import annotations

import pytest

from recovery.models import CaseEvidence, ProcessStop, RecoveryCase
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
        path="endpoints.demo.stuck",
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
    client.force_login(owner)
    page = client.get(f"/recovery/{case.id}/").content.decode()
    assert "Stop the process" in page and str(slot["pid"]) in page

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
