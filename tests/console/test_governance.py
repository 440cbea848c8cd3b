"""Console pages of governed change: an owner proposes from the endpoint
page or from a lesson, another owner approves on the proposal page, the
dashboard queues what waits for review; strangers find nothing."""

from __future__ import annotations

import pytest

from console.owners import create_owner
from endpoints import proposals, services
from endpoints.models import ChangeProposal, Endpoint, EndpointGeneration
from recovery import services as recovery_services

from .helpers import echo_endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_owners(db):
    echo_endpoint("gov.ep")
    return (
        create_owner(username="olive", password="pw-olive-1", endpoints=["gov.ep"]),
        create_owner(username="oscar", password="pw-oscar-1", endpoints=["gov.ep"]),
    )


def _change(**fields):
    endpoint = Endpoint.objects.get(address="gov.ep")
    data = {
        "change-turn_budget_s": endpoint.turn_budget_s,
        "change-interrupt_grace_s": endpoint.interrupt_grace_s,
        "change-heartbeat_timeout_s": endpoint.heartbeat_timeout_s,
        "change-busy_policy": endpoint.busy_policy,
        "change-requires_approval": "no",
        "change-notes": endpoint.notes,
        "change-reason": "shorter runs",
        "change-generation": endpoint.generation,
    }
    data.update({f"change-{k}": v for k, v in fields.items()})
    return data


def test_propose_on_the_endpoint_page_and_another_owner_approves(client, two_owners):
    olive, oscar = two_owners
    client.force_login(olive)
    page = client.get("/endpoints/gov.ep/").content.decode()
    assert 'id="generations"' in page and "Propose a change" in page
    resp = client.post("/endpoints/gov.ep/propose/", _change(turn_budget_s=30))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    proposal = ChangeProposal.objects.get()
    assert proposal.changes == {"turn_budget_s": 30.0}
    # The proposer may not approve it: no approve button, and a POST is refused.
    page = client.get(f"/proposals/{proposal.id}/").content.decode()
    assert "Approve and apply" not in page
    refused = client.post(
        f"/proposals/{proposal.id}/review/", {"review-reason": "me", "verdict": "approve"}
    )
    assert refused.status_code == 422
    assert "second person" in refused.content.decode()
    client.force_login(oscar)
    assert str(proposal.id)[-8:] in client.get("/").content.decode()  # the review queue
    resp = client.post(
        f"/proposals/{proposal.id}/review/", {"review-reason": "fine", "verdict": "approve"}
    )
    assert resp.status_code == 302
    assert Endpoint.objects.get(address="gov.ep").generation == 2
    page = client.get(f"/proposals/{proposal.id}/").content.decode()
    assert "generation #2" in page and 'id="did-it-help"' in page
    page = client.get("/endpoints/gov.ep/").content.decode()
    assert 'data-generation="2"' in page and 'data-generation="1"' in page


def test_a_stale_proposal_shows_the_newer_diff(client, two_owners):
    olive, oscar = two_owners
    first = proposals.propose_change(
        address="gov.ep", user=olive, base_generation=1, changes={"notes": "a"}, reason="r"
    )
    second = proposals.propose_change(
        address="gov.ep", user=olive, base_generation=1, changes={"notes": "b"}, reason="r"
    )
    proposals.review_proposal(proposal_id=first.id, user=oscar, approve=True, reason="ok")
    client.force_login(oscar)
    resp = client.post(
        f"/proposals/{second.id}/review/", {"review-reason": "ok", "verdict": "approve"}
    )
    assert resp.status_code == 422
    body = resp.content.decode()
    assert 'id="stale"' in body and "generation 2" in body
    assert EndpointGeneration.objects.filter(endpoint__address="gov.ep").count() == 2


def test_rollback_from_the_history(client, two_owners):
    olive, oscar = two_owners
    services.update_endpoint(address="gov.ep", changes={"turn_budget_s": 9}, reason="t")
    client.force_login(olive)
    resp = client.post(
        "/endpoints/gov.ep/rollback/",
        {"to_generation": 1, "generation": 2, "reason": "budget too small"},
    )
    assert resp.status_code == 302
    proposal = ChangeProposal.objects.get()
    assert proposal.restores == 1 and proposal.changes == {"turn_budget_s": 300.0}


def test_strangers_see_no_governance(client, two_owners, member):
    olive, _ = two_owners
    proposal = proposals.propose_change(
        address="gov.ep", user=olive, base_generation=1, changes={"notes": "a"}, reason="r"
    )
    client.force_login(member)
    page = client.get("/endpoints/gov.ep/").content.decode()
    assert 'id="generations"' not in page
    assert client.get(f"/proposals/{proposal.id}/").status_code == 404
    assert (
        client.post(
            f"/proposals/{proposal.id}/review/", {"review-reason": "x", "verdict": "reject"}
        ).status_code
        == 404
    )
    assert client.post("/endpoints/gov.ep/propose/", _change(turn_budget_s=5)).status_code == 404
    assert str(proposal.id)[-8:] not in client.get("/").content.decode()


def test_a_lesson_proposes_a_change_and_its_page_shows_it(client, case, owner):
    inspection = recovery_services.inspect_case(case_id=case.id, user=owner)
    recovery_services.decide(
        case_id=case.id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="r",
    )
    client.force_login(owner)
    resp = client.post(
        f"/recovery/{case.id}/lesson/",
        {
            "lesson-what_failed": "it hung",
            "lesson-evidence": "no stop receipt",
            "lesson-prevention": "a smaller budget",
            "lesson-propose_turn_budget_s": "20",
            "lesson-propose_notes": "",
            "lesson-proposal_generation": "1",
        },
    )
    assert resp.status_code == 302, resp.content.decode()[:3000]
    proposal = ChangeProposal.objects.get()
    assert proposal.origin["case"] == str(case.id)
    assert proposal.changes == {"turn_budget_s": 20.0}
    page = client.get(f"/recovery/{case.id}/").content.decode()
    assert f"lesson-proposal-{proposal.id}" in page
    assert str(proposal.id)[-8:] in client.get("/lessons/").content.decode()


def test_the_review_queue_costs_the_same_for_many_proposals(
    client, two_owners, django_assert_max_num_queries
):
    olive, oscar = two_owners
    for n in range(10):
        proposals.propose_change(
            address="gov.ep", user=olive, base_generation=1, changes={"notes": f"{n}"}, reason="r"
        )
    client.force_login(oscar)
    with django_assert_max_num_queries(30):
        body = client.get("/").content.decode()
    assert body.count("/proposals/") >= 10
