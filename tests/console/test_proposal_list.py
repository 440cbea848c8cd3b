"""The proposals page (``GET /proposals/``): the proposals of the endpoints
a user owns (staff: all), filtered by state, each linking to its review;
linked from the nav. A stranger sees none of them, and a stranger's
proposal is 404 to them."""

from __future__ import annotations

import pytest

from console.owners import create_owner
from endpoints.proposals import propose_change, review_proposal

from .helpers import echo_endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def proposals(db):
    """On ``list.a`` (olive, oscar): one approved, one stale (proposed
    against generation 1, which the approval moved past), one open; on
    ``list.b`` (sally alone): one open."""
    echo_endpoint("list.a")
    echo_endpoint("list.b")
    olive = create_owner(username="olive", password="pw-olive-1", endpoints=["list.a"])
    oscar = create_owner(username="oscar", password="pw-oscar-1", endpoints=["list.a"])
    sally = create_owner(username="sally", password="pw-sally-1", endpoints=["list.b"])

    def propose(user, address, base, budget, reason):
        return propose_change(
            address=address,
            user=user,
            base_generation=base,
            changes={"turn_budget_s": budget},
            reason=reason,
        )

    approved = propose(olive, "list.a", 1, 12.0, "shorter")
    stale = propose(oscar, "list.a", 1, 40.0, "longer")
    review_proposal(proposal_id=approved.id, user=oscar, approve=True, reason="agreed")
    opened = propose(olive, "list.a", 2, 20.0, "in between")
    foreign = propose(sally, "list.b", 1, 5.0, "sally's own")
    return {
        "users": (olive, oscar, sally),
        "approved": approved,
        "stale": stale,
        "open": opened,
        "foreign": foreign,
    }


def _ids(response) -> set[str]:
    return {p["id"] for p in response.context["proposals"]}


def test_an_owner_lists_the_proposals_of_their_endpoints_by_state(client, proposals):
    olive = proposals["users"][0]
    client.force_login(olive)
    every = client.get("/proposals/")
    assert every.status_code == 200
    mine = {str(proposals[k].id) for k in ("approved", "stale", "open")}
    assert _ids(every) == mine
    body = every.content.decode()
    for key in ("approved", "stale", "open"):
        assert f'href="/proposals/{proposals[key].id}/"' in body
    assert str(proposals["foreign"].id) not in body
    assert 'href="/proposals/" aria-current="page"' in body  # the nav
    for state in ("approved", "stale", "open"):
        response = client.get("/proposals/", {"state": state})
        assert response.status_code == 200
        assert _ids(response) == {str(proposals[state].id)}, state
        assert [p["status"] for p in response.context["proposals"]] == [state]
    assert _ids(client.get("/proposals/", {"state": "rejected"})) == set()


def test_a_state_that_is_not_one_is_a_clear_400(client, proposals):
    client.force_login(proposals["users"][0])
    response = client.get("/proposals/", {"state": "pending"})
    assert response.status_code == 400
    assert "state must be one of open, stale, approved, rejected" in response.content.decode()


def test_a_stranger_sees_no_proposal_and_staff_see_every_one(client, proposals, django_user_model):
    sally = proposals["users"][2]
    client.force_login(sally)
    assert _ids(client.get("/proposals/")) == {str(proposals["foreign"].id)}
    assert client.get(f"/proposals/{proposals['open'].id}/").status_code == 404
    staff = django_user_model.objects.create_user("stef", password="pw-stef-1", is_staff=True)
    client.force_login(staff)
    assert len(_ids(client.get("/proposals/"))) == 4


def test_the_page_needs_a_login(client, proposals):
    response = client.get("/proposals/")
    assert response.status_code == 302 and "/login/" in response["Location"]
