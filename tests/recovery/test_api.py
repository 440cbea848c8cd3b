"""Recovery routes (API.md "Recovery"): shapes, the owner rule (404), the
documented 400s, unknown and malformed ids (404, never 500), 409 on a case in
the wrong state; nothing half-written by a refused call."""

from __future__ import annotations

import pytest

from recovery.models import Decision, Inspection, Lesson
from tickets.models import RetentionHold, Ticket

from .conftest import dump_ledger

pytestmark = pytest.mark.django_db

UNKNOWN = "01930000-0000-7000-8000-000000000000"


def inspect(client, case_id):
    resp = client.post(f"/recovery/cases/{case_id}/inspections")
    assert resp.status_code == 201, resp.content
    return resp.json()


def test_walk_inspect_rerun_lesson_through_the_api(quarantine, owner_api):
    q = quarantine(dedupe_key="walk")
    listed = owner_api.get("/recovery/cases", state="open")
    assert listed.status_code == 200
    assert [c["id"] for c in listed.json()] == [str(q.case.id)]

    case = owner_api.get(f"/recovery/cases/{q.case.id}").json()
    assert case["id"] == str(q.case.id)
    assert case["endpoint"] == q.endpoint.address
    assert case["ticket"] == str(q.ticket.id) and case["turn"] == str(q.turn.id)
    assert case["state"] == "open" and case["opened_at"].endswith("Z")
    assert "gave no stop evidence" in case["reason"]
    assert (case["inspections"], case["decisions"], case["lesson"]) == ([], [], None)

    inspection = inspect(owner_api, q.case.id)
    assert set(inspection) >= {"id", "sha256", "created_at", "actor", "snapshot"}
    assert inspection["actor"] == "owner"
    assert len(inspection["sha256"]) == 64
    assert set(inspection["snapshot"]) >= {
        "ticket",
        "turn",
        "lock",
        "callbacks",
        "outputs",
        "events",
        "evidence",
    }

    resp = owner_api.post(
        f"/recovery/cases/{q.case.id}/decisions",
        {
            "action": "authorize_rerun",
            "inspection": inspection["id"],
            "rationale": "the brief is idempotent",
        },
    )
    assert resp.status_code == 201, resp.content
    decision = resp.json()
    assert set(decision) >= {
        "id",
        "action",
        "actor",
        "rationale",
        "inspection",
        "created_at",
        "rerun_ticket",
    }
    assert decision["action"] == "authorize_rerun" and decision["actor"] == "owner"
    assert decision["inspection"] == inspection["id"]
    # The re-run is held in the ledger: retention keeps it while the case is kept.
    assert RetentionHold.objects.filter(
        ticket_id=decision["rerun_ticket"], held_by=f"recovery decision {decision['id']}"
    ).exists()
    rerun = owner_api.get(f"/tickets/{decision['rerun_ticket']}").json()
    assert rerun["parent"] == str(q.ticket.id) and rerun["dedupe_key"] == "walk:rerun:1"
    original = owner_api.get(f"/tickets/{q.ticket.id}").json()
    assert original["state"] == "orphaned" and original["result"] is None

    resp = owner_api.post(
        f"/recovery/cases/{q.case.id}/lesson",
        {
            "what_failed": "stuck runner",
            "evidence": "no stop receipt",
            "prevention": "poll",
        },
    )
    assert resp.status_code == 201, resp.content
    assert resp.json()["what_failed"] == "stuck runner"

    case = owner_api.get(f"/recovery/cases/{q.case.id}").json()
    assert case["state"] == "closed"
    assert [i["id"] for i in case["inspections"]] == [inspection["id"]]
    assert case["inspections"][0]["snapshot"] == inspection["snapshot"]
    assert [d["id"] for d in case["decisions"]] == [decision["id"]]
    assert case["lesson"]["prevention"] == "poll"
    assert owner_api.get("/recovery/cases", state="open").json() == []
    assert [c["id"] for c in owner_api.get("/recovery/cases", state="closed").json()] == [
        str(q.case.id)
    ]


def test_keep_quarantined_and_release_through_the_api(quarantine, owner_api):
    q = quarantine()
    inspection = inspect(owner_api, q.case.id)
    url = f"/recovery/cases/{q.case.id}/decisions"
    keep = owner_api.post(
        url,
        {
            "action": "keep_quarantined",
            "inspection": inspection["id"],
            "rationale": "waiting for the vendor",
        },
    )
    assert keep.status_code == 201 and keep.json()["rerun_ticket"] is None
    assert owner_api.get(f"/endpoints/{q.endpoint.address}").json()["state"] == "quarantined"
    release = owner_api.post(
        url,
        {
            "action": "release",
            "inspection": inspection["id"],
            "rationale": "vendor confirmed",
            "evidence": "ticket #991",
        },
    )
    assert release.status_code == 201, release.content
    assert release.json()["evidence"] == "ticket #991"
    endpoint = owner_api.get(f"/endpoints/{q.endpoint.address}").json()
    assert endpoint["state"] == "available" and endpoint["open_case"] is None
    turn = owner_api.get(f"/turns/{q.turn.id}").json()
    assert turn["state"] == "stopped" and turn["stop_evidence"]["kind"] == "owner_evidence"
    assert owner_api.get(f"/tickets/{q.ticket.id}").json()["error"]["code"] == "released"


def test_staff_may_act_as_owner(quarantine, api):
    q = quarantine()
    assert api.post(f"/recovery/cases/{q.case.id}/inspections").status_code == 201


def test_a_non_owner_finds_no_case_and_nothing_is_written(quarantine, owner_api, outsider_api):
    q = quarantine()
    inspection = inspect(owner_api, q.case.id)
    before = dump_ledger(exclude=())
    calls = [
        (f"/recovery/cases/{q.case.id}/inspections", None),
        (
            f"/recovery/cases/{q.case.id}/decisions",
            {"action": "finalize_orphan", "inspection": inspection["id"], "rationale": "mine"},
        ),
        (
            f"/recovery/cases/{q.case.id}/lesson",
            {"what_failed": "a", "evidence": "b", "prevention": "c"},
        ),
    ]
    for path, body in calls:
        resp = outsider_api.post(path, body)
        assert resp.status_code == 404, (path, resp.content)
        assert resp.json()["error"] == "not_found" and resp.json()["detail"]
    assert dump_ledger(exclude=()) == before
    # Cases are the owners' (and staff's): to anyone else they do not exist.
    assert outsider_api.get(f"/recovery/cases/{q.case.id}").status_code == 404
    assert outsider_api.get("/recovery/cases").json() == []


def test_documented_bad_decisions_are_400_and_write_nothing(quarantine, owner_api):
    q = quarantine()
    other = quarantine()
    mine = inspect(owner_api, q.case.id)["id"]
    theirs = inspect(owner_api, other.case.id)["id"]
    before = dump_ledger(exclude=())
    url = f"/recovery/cases/{q.case.id}/decisions"
    bad = [
        (
            "inspection of another case",
            {"action": "finalize_orphan", "inspection": theirs, "rationale": "r"},
            400,
        ),
        (
            "unknown inspection",
            {"action": "finalize_orphan", "inspection": UNKNOWN, "rationale": "r"},
            400,
        ),
        (
            "malformed inspection",
            {"action": "finalize_orphan", "inspection": "x", "rationale": "r"},
            400,
        ),
        ("no inspection", {"action": "finalize_orphan", "rationale": "r"}, 400),
        ("missing rationale", {"action": "finalize_orphan", "inspection": mine}, 400),
        (
            "empty rationale",
            {"action": "finalize_orphan", "inspection": mine, "rationale": ""},
            400,
        ),
        (
            "blank rationale",
            {"action": "finalize_orphan", "inspection": mine, "rationale": "  "},
            400,
        ),
        (
            "release without evidence",
            {"action": "release", "inspection": mine, "rationale": "r"},
            400,
        ),
        (
            "release with empty evidence",
            {"action": "release", "inspection": mine, "rationale": "r", "evidence": " "},
            400,
        ),
        ("unknown action", {"action": "shrug", "inspection": mine, "rationale": "r"}, 422),
        ("missing action", {"inspection": mine, "rationale": "r"}, 422),
        (
            "unknown field",
            {"action": "finalize_orphan", "inspection": mine, "rationale": "r", "force": True},
            422,
        ),
        (
            "rationale not text",
            {"action": "finalize_orphan", "inspection": mine, "rationale": 7},
            422,
        ),
    ]
    for why, body, status in bad:
        resp = owner_api.post(url, body)
        assert resp.status_code == status, (why, resp.content)
        assert resp.json()["error"] == "invalid", why
        assert resp.json()["detail"], why
    malformed = owner_api.post(url, raw="{nope")
    assert malformed.status_code == 400 and malformed.json()["error"] == "invalid"
    assert dump_ledger(exclude=()) == before


def test_bad_lessons_are_400_and_an_undecided_case_is_409(quarantine, owner_api):
    q = quarantine()
    url = f"/recovery/cases/{q.case.id}/lesson"
    full = {"what_failed": "a", "evidence": "b", "prevention": "c"}
    early = owner_api.post(url, full)
    assert early.status_code == 409
    assert early.json()["error"] == "invalid_transition" and early.json()["state"] == "open"
    inspection = inspect(owner_api, q.case.id)
    owner_api.post(
        f"/recovery/cases/{q.case.id}/decisions",
        {"action": "finalize_orphan", "inspection": inspection["id"], "rationale": "r"},
    )
    for field in full:
        for value in ("", "   "):
            resp = owner_api.post(url, {**full, field: value})
            assert resp.status_code == 400, (field, resp.content)
            assert resp.json()["error"] == "invalid"
        missing = {k: v for k, v in full.items() if k != field}
        assert owner_api.post(url, missing).status_code == 400
    assert owner_api.post(url, {**full, "extra": 1}).status_code == 422
    assert Lesson.objects.count() == 0
    assert owner_api.post(url, full).status_code == 201
    again = owner_api.post(url, full)
    assert again.status_code == 409 and again.json()["state"] == "closed"


def test_a_decided_case_refuses_decisions_with_409(quarantine, owner_api):
    q = quarantine()
    inspection = inspect(owner_api, q.case.id)
    url = f"/recovery/cases/{q.case.id}/decisions"
    body = {"action": "finalize_orphan", "inspection": inspection["id"], "rationale": "r"}
    assert owner_api.post(url, body).status_code == 201
    again = owner_api.post(url, {**body, "action": "authorize_rerun"})
    assert again.status_code == 409
    assert again.json() == {
        "error": "invalid_transition",
        "detail": again.json()["detail"],
        "state": "decided",
    }
    assert Decision.objects.count() == 1
    assert Ticket.objects.filter(parent=q.ticket).count() == 0


@pytest.mark.parametrize("case_id", [UNKNOWN, "not-a-uuid", "1", "%20"])
def test_unknown_or_malformed_case_is_404_on_every_route(owner_api, case_id):
    calls = [
        ("get", f"/recovery/cases/{case_id}", None),
        ("post", f"/recovery/cases/{case_id}/inspections", None),
        (
            "post",
            f"/recovery/cases/{case_id}/decisions",
            {"action": "finalize_orphan", "inspection": UNKNOWN, "rationale": "r"},
        ),
        (
            "post",
            f"/recovery/cases/{case_id}/lesson",
            {"what_failed": "a", "evidence": "b", "prevention": "c"},
        ),
    ]
    for method, path, body in calls:
        resp = owner_api.get(path) if method == "get" else owner_api.post(path, body)
        assert resp.status_code == 404, (path, resp.content)
        assert resp.json()["error"] == "not_found"
    assert Inspection.objects.count() == 0


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"state": "bogus"}, 400),
        ({"limit": 0}, 422),  # out of the declared bounds
        ({"limit": "x"}, 422),
    ],
)
def test_bad_list_filters_are_invalid(owner_api, query, status):
    resp = owner_api.get("/recovery/cases", **query)
    assert resp.status_code == status and resp.json()["error"] == "invalid"


def test_recovery_routes_need_a_key(quarantine, api):
    q = quarantine()
    anonymous = api.as_key("cc_000000000000_nope")
    for resp in (
        anonymous.get("/recovery/cases"),
        anonymous.post(f"/recovery/cases/{q.case.id}/inspections"),
    ):
        assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"


def test_recovery_routes_are_in_the_openapi_schema(client):
    resp = client.get("/api/v1/openapi.json")
    assert resp.status_code == 200
    paths = resp.json()["paths"]
    for path in (
        "/api/v1/recovery/cases",
        "/api/v1/recovery/cases/{case_id}",
        "/api/v1/recovery/cases/{case_id}/inspections",
        "/api/v1/recovery/cases/{case_id}/decisions",
        "/api/v1/recovery/cases/{case_id}/lesson",
    ):
        assert path in paths, path
    decision_in = resp.json()["components"]["schemas"]["DecisionIn"]
    assert decision_in["additionalProperties"] is False
    assert set(decision_in["properties"]["action"]["enum"]) == {
        "finalize_orphan",
        "authorize_rerun",
        "keep_quarantined",
        "release",
    }
