"""Who sees which ticket (API.md "Who may see and do what"; issue 9 findings
1 and 5), and who may submit to an endpoint: the rules in the selectors and
admission, beyond the route-by-route matrix in tests/test_authorization.py."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.keys import create_api_key
from core.errors import Forbidden, NotFound
from endpoints.services import update_endpoint
from tickets import selectors
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(django_user_model, api):
    """alice and bob submit; olive owns ``alpha``; each has an API client."""
    users = {
        name: django_user_model.objects.create_user(name) for name in ("alice", "bob", "olive")
    }
    clients = {name: api.as_key(create_api_key(username=name)[1]) for name in users}
    return users, clients


def test_lists_hold_only_visible_tickets_and_keep_their_keyset_order(people, make_endpoint, api):
    users, clients = people
    make_endpoint("alpha", owners=["olive"])
    make_endpoint("beta")
    mine, theirs = [], []
    for n in range(3):  # interleaved: the cursor must skip bob's rows, not stop at them
        mine.append(clients["alice"].post("/tickets", {"endpoint": "beta", "input": {"n": n}}))
        theirs.append(clients["bob"].post("/tickets", {"endpoint": "beta", "input": {"n": n}}))
    mine = [r.json()["id"] for r in mine]
    theirs = [r.json()["id"] for r in theirs]
    on_alpha = clients["bob"].post("/tickets", {"endpoint": "alpha", "input": {}}).json()["id"]

    page1 = clients["alice"].get("/tickets", limit=2).json()
    page2 = clients["alice"].get("/tickets", limit=2, cursor=page1["next_cursor"]).json()
    assert [t["id"] for t in page1["items"]] == mine[::-1][:2]
    assert [t["id"] for t in page2["items"]] == mine[::-1][2:]
    assert page2["next_cursor"] is None
    assert [t["id"] for t in clients["bob"].get("/tickets").json()["items"]] == [
        on_alpha,
        *theirs[::-1],
    ]
    # The owner of alpha sees alpha's tickets, whoever submitted them.
    assert [t["id"] for t in clients["olive"].get("/tickets").json()["items"]] == [on_alpha]
    assert len(api.get("/tickets").json()["items"]) == 7  # staff: everything


def test_a_submitters_list_reads_their_index(people, make_endpoint):
    users, _ = people
    plan = _plan(selectors.visible_tickets(users["alice"]).order_by("-id")[:51])
    assert "ticket_submitter_id_idx" in plan, plan


def _plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cur:
        # Small test tables would be scanned sequentially anyway; forbid it
        # to see which index the planner can use for this exact query.
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_a_trace_shows_only_what_the_caller_may_see(people, make_endpoint):
    users, clients = people
    make_endpoint("alpha", owners=["olive"])
    make_endpoint("beta")
    root = clients["alice"].post("/tickets", {"endpoint": "beta", "input": {}}).json()
    # A child on an endpoint olive owns, dispatched by the runtime (no submitter).
    child = admit_ticket(endpoint="alpha", input={}, parent_id=root["id"]).ticket
    alice = clients["alice"].get(f"/tickets/{root['id']}/lineage").json()
    assert [n["id"] for n in alice["nodes"]] == [root["id"]]
    assert alice["root"] == root["id"]
    olive = clients["olive"].get(f"/tickets/{child.id}/lineage").json()
    assert [n["id"] for n in olive["nodes"]] == [str(child.id)]
    assert olive["root"] is None  # the root is not hers to see
    assert clients["bob"].get(f"/tickets/{root['id']}/lineage").status_code == 404
    by_trace = clients["olive"].get("/tickets", trace_id=root["trace_id"]).json()["items"]
    assert [t["id"] for t in by_trace] == [str(child.id)]


# --- Admission: duplicates, parents, return_to ---------------------------------------------------


def test_someone_elses_dedupe_key_names_no_ticket(people, make_endpoint):
    users, clients = people
    make_endpoint("beta")
    first = clients["alice"].post(
        "/tickets", {"endpoint": "beta", "input": {"x": 1}, "dedupe_key": "k"}
    )
    for body in ({"x": 1}, {"x": 2}):  # same input, and a different one
        resp = clients["bob"].post(
            "/tickets", {"endpoint": "beta", "input": body, "dedupe_key": "k"}
        )
        assert resp.status_code == 409 and resp.json()["error"] == "dedupe_conflict"
        assert "ticket" not in resp.json() and first.json()["id"] not in resp.content.decode()
    again = clients["alice"].post(
        "/tickets", {"endpoint": "beta", "input": {"x": 1}, "dedupe_key": "k"}
    )
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    conflict = clients["alice"].post(
        "/tickets", {"endpoint": "beta", "input": {"x": 2}, "dedupe_key": "k"}
    )
    assert conflict.status_code == 409 and conflict.json()["ticket"] == first.json()["id"]
    # The endpoint's owner (or staff) sees it: the duplicate is returned.
    update_endpoint(address="beta", changes={"owners": ["olive"]})
    owned = clients["olive"].post(
        "/tickets", {"endpoint": "beta", "input": {"x": 1}, "dedupe_key": "k"}
    )
    assert owned.status_code == 200 and owned.json()["id"] == first.json()["id"]


def test_a_parent_must_be_a_ticket_the_caller_may_see(people, make_endpoint):
    users, clients = people
    make_endpoint("beta")
    parent = clients["alice"].post("/tickets", {"endpoint": "beta", "input": {}}).json()
    stranger = clients["bob"].post(
        "/tickets", {"endpoint": "beta", "input": {}, "parent": parent["id"]}
    )
    assert stranger.status_code == 404 and stranger.json()["error"] == "not_found"
    own = clients["alice"].post(
        "/tickets", {"endpoint": "beta", "input": {}, "parent": parent["id"]}
    )
    assert own.status_code == 201 and own.json()["trace_id"] == parent["trace_id"]
    assert Ticket.objects.filter(parent_id=parent["id"]).count() == 1


# --- Who may submit --------------------------------------------------------------------------


def test_a_restricted_endpoint_admits_its_listed_users_groups_owners_and_staff(
    people, make_endpoint, api, django_user_model
):
    users, clients = people
    carol = django_user_model.objects.create_user("carol")
    Group.objects.create(name="team").user_set.add(carol)
    carol_api = api.as_key(create_api_key(username="carol")[1])
    make_endpoint("gated", owners=["olive"], submitters={"users": ["alice"], "groups": ["team"]})
    assert api.get("/endpoints/gated").json()["submitters"] == {
        "users": ["alice"],
        "groups": ["team"],
    }
    for who, client in zip(
        ("alice", "carol", "olive", "staff"),
        (clients["alice"], carol_api, clients["olive"], api),
        strict=True,
    ):
        resp = client.post("/tickets", {"endpoint": "gated", "input": {}})
        assert resp.status_code == 201, (who, resp.content)
    refused = clients["bob"].post("/tickets", {"endpoint": "gated", "input": {}})
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert Ticket.objects.filter(endpoint__address="gated").count() == 4
    # Unrestricted again: anyone may submit.
    api.patch("/endpoints/gated", {"submitters": None})
    assert clients["bob"].post("/tickets", {"endpoint": "gated", "input": {}}).status_code == 201


def test_a_refused_submitter_learns_nothing_about_existing_tickets(people, make_endpoint):
    users, _ = people
    make_endpoint("gated", submitters={"users": ["alice"]})
    admit_ticket(endpoint="gated", input={"x": 1}, dedupe_key="k", submitter=users["alice"])
    with CaptureQueriesContext(connection) as queries, pytest.raises(Forbidden):
        admit_ticket(endpoint="gated", input={"x": 1}, dedupe_key="k", submitter=users["bob"])
    # Refused before the dedupe lookup: no statement read the tickets table.
    assert not [q for q in queries if "tickets_ticket" in q["sql"]], queries.captured_queries


def test_return_to_a_restricted_endpoint_is_refused(people, make_endpoint):
    users, clients = people
    make_endpoint("beta")
    make_endpoint("gated", submitters={"users": ["alice"]})
    body = {"endpoint": "beta", "input": {}, "return_to": {"endpoint": "gated"}}
    assert clients["bob"].post("/tickets", body).status_code == 403
    assert clients["alice"].post("/tickets", body).status_code == 201


def test_an_unrestricted_admission_is_still_one_statement(
    people, make_endpoint, django_assert_num_queries
):
    users, _ = people
    make_endpoint("open")
    with django_assert_num_queries(1):
        admitted = admit_ticket(endpoint="open", input={"x": 1}, submitter=users["bob"])
    assert Ticket.objects.get(id=admitted.ticket.id).submitted_by_id == users["bob"].id


def test_a_restricted_admission_costs_its_check_and_one_more_statement(people, make_endpoint):
    users, _ = people
    make_endpoint("gated", submitters={"users": ["alice"]})
    admit_ticket(endpoint="gated", input={"warm": 1}, submitter=users["alice"])
    # Without a caller to check it is one statement; with alice, the function
    # sends her back for the directory's check (one query) and is called again.
    with CaptureQueriesContext(connection) as unchecked:
        admit_ticket(endpoint="gated", input={"x": 0})
    with CaptureQueriesContext(connection) as checked:
        admit_ticket(endpoint="gated", input={"x": 1}, submitter=users["alice"])
    assert len(unchecked) == 1
    assert len(checked) == len(unchecked) + 2


def test_the_runtime_admits_children_to_a_restricted_endpoint(make_endpoint):
    # Children and callbacks are admitted by the runtime, not by a key.
    make_endpoint("gated", submitters={"users": []})
    assert admit_ticket(endpoint="gated", input={}).ticket.id


def test_a_stranger_cannot_read_a_ticket_by_guessing_its_id(people, make_endpoint):
    users, _ = people
    make_endpoint("beta")
    ticket = admit_ticket(endpoint="beta", input={}, submitter=users["alice"]).ticket
    with pytest.raises(NotFound):
        selectors.get_visible_ticket(ticket.id, user=users["bob"])
    assert selectors.get_visible_ticket(ticket.id, user=users["alice"]).id == ticket.id
