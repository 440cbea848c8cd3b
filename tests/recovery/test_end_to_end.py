"""Recovery end to end through the API with a real worker and beat: a turn
that ignores its interrupt quarantines its endpoint; the owner inspects,
authorizes a re-run under a new identity, and closes the case with a lesson."""

from __future__ import annotations

import os

import pytest

from recovery.models import CaseEvidence
from tests.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_stuck_turn_is_quarantined_then_rerun_by_its_owner(
    worker, make_endpoint, api, owner_api, owner
):
    # demo.stuck sleeps and ignores interrupts. 12 s is well past budget plus
    # grace plus two sweeps, also on a loaded machine (a shorter turn may
    # return, and prove its stop, before the test sees the quarantine), and
    # short enough to free the worker quickly.
    make_endpoint(
        "rec.stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        turn_budget_s=1,
        interrupt_grace_s=1,
    )
    created = api.post(
        "/tickets", {"endpoint": "rec.stuck", "input": {"seconds": 12}, "dedupe_key": "e2e"}
    )
    assert created.status_code == 201, created.content
    original_id = created.json()["id"]

    def quarantined():
        endpoint = api.get("/endpoints/rec.stuck").json()
        return endpoint if endpoint["open_case"] else None

    endpoint = wait_for(
        quarantined,
        timeout=60,
        interval=0.2,
        message="the sweeps to interrupt, then quarantine, the stuck turn",
    )
    case_id = endpoint["open_case"]
    assert endpoint["state"] == "quarantined"

    # Fail closed: admission names the case.
    refused = api.post("/tickets", {"endpoint": "rec.stuck", "input": {"seconds": 0}})
    assert refused.status_code == 423, refused.content
    assert refused.json()["error"] == "endpoint_quarantined"
    assert refused.json()["case"] == case_id

    case = owner_api.get(f"/recovery/cases/{case_id}").json()
    assert case["state"] == "open" and case["ticket"] == original_id
    assert [c["id"] for c in owner_api.get("/recovery/cases", state="open").json()] == [case_id]

    resp = owner_api.post(f"/recovery/cases/{case_id}/inspections")
    assert resp.status_code == 201, resp.content
    inspection = resp.json()
    snap = inspection["snapshot"]
    assert snap["ticket"]["state"] == "recovering" and snap["ticket"]["result"] is None
    assert snap["turn"]["state"] == "uncertain" and snap["turn"]["seq"] == 1
    assert snap["turn"]["interrupt_reason"] == "deadline"
    assert snap["turn"]["worker"]["pid"] != os.getpid()  # it ran in the worker process
    assert snap["lock"]["held_by_uncertain_turn"] is True
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds[:2] == ["admitted", "turn_started"]
    assert {"interrupt_requested", "turn_uncertain", "endpoint_quarantined"} <= set(kinds)

    # The owner's fix before re-running: a budget the work fits in.
    assert api.patch("/endpoints/rec.stuck", {"turn_budget_s": 30}).status_code == 200
    resp = owner_api.post(
        f"/recovery/cases/{case_id}/decisions",
        {
            "action": "authorize_rerun",
            "inspection": inspection["id"],
            "rationale": "sleeping is idempotent; the budget was too tight",
        },
    )
    assert resp.status_code == 201, resp.content
    rerun_id = resp.json()["rerun_ticket"]
    assert rerun_id and rerun_id != original_id

    rerun = wait_for(
        lambda: (t := api.get(f"/tickets/{rerun_id}").json())["state"] == "succeeded" and t,
        timeout=60,
        interval=0.2,
        message="the re-run to be dispatched and succeed",
    )
    assert rerun["result"] == {"slept_s": 12.0}
    assert rerun["parent"] == original_id and rerun["depth"] == 1
    assert rerun["dedupe_key"] == "e2e:rerun:1"
    assert rerun["turn"]["seq"] == 2
    original = api.get(f"/tickets/{original_id}").json()
    assert original["state"] == "orphaned" and original["result"] is None
    assert rerun["trace_id"] == original["trace_id"]
    lineage = api.get(f"/tickets/{rerun_id}/lineage").json()
    assert lineage["root"] == original_id

    # The stuck turn's own late return is evidence on the case, applied to nothing.
    wait_for(
        lambda: CaseEvidence.objects.filter(case_id=case_id).exists(),
        timeout=60,
        message="the stuck turn's late return to be recorded",
    )
    again = owner_api.post(f"/recovery/cases/{case_id}/inspections").json()
    assert again["snapshot"]["evidence"]["items"][0]["seq"] == 1
    assert again["snapshot"]["evidence"]["late_stop_receipt"] is True  # it returned, late
    assert api.get(f"/tickets/{original_id}").json()["result"] is None
    assert api.get(f"/turns/{case['turn']}").json()["state"] == "unresolved"

    resp = owner_api.post(
        f"/recovery/cases/{case_id}/lesson",
        {
            "what_failed": "demo.stuck ignores interrupts and ran past a 1 s budget",
            "evidence": "no stop receipt within the 1 s grace; the return came 8 s in",
            "prevention": "budget above the expected duration; runners that poll interrupted()",
        },
    )
    assert resp.status_code == 201, resp.content
    case = owner_api.get(f"/recovery/cases/{case_id}").json()
    assert case["state"] == "closed" and case["lesson"]["id"] == resp.json()["id"]
    assert [d["action"] for d in case["decisions"]] == ["authorize_rerun"]
    endpoint = api.get("/endpoints/rec.stuck").json()
    assert endpoint["state"] == "available" and endpoint["open_case"] is None
