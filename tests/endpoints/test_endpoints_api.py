"""Endpoint routes: create (staff), get by address or alias, list, patch."""

from __future__ import annotations

import threading

import pytest

from accounts.keys import create_api_key

pytestmark = pytest.mark.django_db

RUNNER = {"kind": "python", "path": "runtime.demo.echo"}


def test_staff_creates_an_endpoint_with_its_lock(api, staff_user):
    resp = api.post(
        "/endpoints",
        {
            "address": "research.brief",
            "runner": RUNNER,
            "owners": ["staff"],
            "aliases": ["brief"],
            "turn_budget_s": 60,
            "busy_policy": "reject",
        },
    )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["address"] == "research.brief" and body["aliases"] == ["brief"]
    assert body["owners"] == ["staff"] and body["state"] == "available"
    assert body["lock"] == {"holder_turn": None, "token": None, "acquired_at": None}
    assert body["turn_budget_s"] == 60 and body["busy_policy"] == "reject"
    assert body["interrupt_grace_s"] == 10 and body["heartbeat_timeout_s"] == 30
    assert body["queued"] == 0 and body["open_case"] is None
    assert api.get("/endpoints/brief").json()["address"] == "research.brief"
    assert [e["address"] for e in api.get("/endpoints").json()] == ["research.brief"]


def test_non_staff_cannot_create_or_patch(api, make_endpoint):
    make_endpoint("alpha")
    _, key = create_api_key(username="plain")
    plain = api.as_key(key)
    resp = plain.post("/endpoints", {"address": "x", "runner": RUNNER})
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    resp = plain.patch("/endpoints/alpha", {"turn_budget_s": 5})
    assert resp.status_code == 403
    assert plain.get("/endpoints/alpha").status_code == 200


def test_patch_changes_budgets_and_policies(api, make_endpoint):
    make_endpoint("alpha")
    resp = api.patch(
        "/endpoints/alpha",
        {"turn_budget_s": 5, "interrupt_grace_s": 2, "requires_approval": True, "aliases": ["a1"]},
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["turn_budget_s"], body["interrupt_grace_s"], body["requires_approval"]) == (
        5,
        2,
        True,
    )
    assert body["aliases"] == ["a1"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"address": "Bad Address!", "runner": RUNNER}, 400),
        ({"address": "ok", "runner": {"kind": "teleport"}}, 400),
        ({"address": "ok", "runner": {"kind": "python"}}, 400),
        ({"address": "ok", "runner": {"kind": "command", "argv": []}}, 400),
        ({"address": "ok", "runner": {"kind": "http", "url": "ftp://x"}}, 400),
        ({"address": "ok", "runner": RUNNER, "turn_budget_s": -1}, 400),
        ({"address": "ok", "runner": RUNNER, "busy_policy": "sometimes"}, 422),
        ({"address": "ok", "runner": RUNNER, "owners": ["nobody"]}, 404),
        ({"address": "ok", "runner": RUNNER, "aliases": ["alpha"]}, 400),
        ({"address": "alpha", "runner": RUNNER}, 400),
        ({"runner": RUNNER}, 422),
        ({"address": "ok", "runner": RUNNER, "extra": 1}, 422),
    ],
)
def test_bad_endpoint_bodies(api, make_endpoint, body, status):
    make_endpoint("alpha")
    resp = api.post("/endpoints", body)
    assert resp.status_code == status, resp.content
    assert resp.json()["error"] in ("invalid", "not_found")
    assert resp.json()["detail"]


def test_patch_rejects_bad_values(api, make_endpoint):
    make_endpoint("alpha")
    assert api.patch("/endpoints/alpha", {"turn_budget_s": 0}).status_code == 400
    assert api.patch("/endpoints/alpha", {"state": "available"}).status_code == 422
    assert api.patch("/endpoints/nowhere", {"turn_budget_s": 3}).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_is_shown_from_one_snapshot(make_endpoint, monkeypatch):
    """A change that commits while the payload is being read (here: a ticket
    admitted between the lock's read and the queued count) does not show
    in half of it."""
    from django.db import connections

    from runtime import selectors
    from tickets.admission import admit_ticket

    endpoint = make_endpoint("snap.shot")
    original = selectors.runner_spec.public_view

    def meanwhile(runner):
        found = original(runner)  # the snapshot is taken by now

        def admit():
            admit_ticket(endpoint="snap.shot", input={})
            connections.close_all()

        thread = threading.Thread(target=admit)
        thread.start()
        thread.join(10)
        return found

    monkeypatch.setattr(selectors.runner_spec, "public_view", meanwhile)
    assert selectors.endpoint_payload(endpoint, user=None)["queued"] == 0  # as of the snapshot
    monkeypatch.setattr(selectors.runner_spec, "public_view", original)
    assert (
        selectors.endpoint_payload(endpoint, user=None)["queued"] == 1
    )  # committed: seen next time
