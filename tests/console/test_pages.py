"""The console's pages through Django's test client: who may see what, the
htmx regions, and the owner-only recovery forms."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.owners import create_owner
from console.selectors import tickets as ticket_pages
from recovery import services as recovery_services
from recovery.models import Decision, Inspection, Lesson
from tickets.admission import admit_ticket
from tickets.models import Ticket

from .helpers import echo_endpoint, finished_gated_ticket, quarantined_case

HX = {"HTTP_HX_REQUEST": "true"}


def pages(case, ticket):
    return [
        "/",
        "/tickets/",
        f"/tickets/{ticket.id}/",
        f"/traces/{ticket.trace_id}/",
        "/endpoints/",
        f"/endpoints/{case.endpoint.address}/",
        "/recovery/",
        f"/recovery/{case.id}/",
        "/lessons/",
        "/obligations/",
    ]


@pytest.fixture
def ticket(echo):
    return admit_ticket(endpoint=echo.address, input={"q": "hello"}).ticket


def is_full_page(response) -> bool:
    return b"<html" in response.content


def alert_text(response) -> str:
    """The first refusal shown to the user (a service's ``detail``)."""
    match = re.search(r'role="alert">([^<]*)<', response.content.decode())
    assert match, "no alert in the response"
    return match.group(1)


# --- Who may see what ---------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_login_from_every_page(client, case, ticket):
    for url in pages(case, ticket):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_an_expired_session_sends_htmx_back_to_login_for_the_whole_page(client, case, ticket):
    """A region refresh must not swap the login page into the region."""
    for url in pages(case, ticket):
        response = client.get(
            url, HTTP_HX_CURRENT_URL="http://testserver/tickets/?state=queued", **HX
        )
        assert response.status_code == 200, url
        assert response["HX-Redirect"] == "/login/?next=/tickets/%3Fstate%3Dqueued", url
        assert response.content == b"", url
    response = client.post(f"/recovery/{case.id}/inspections/", **HX)
    assert response["HX-Redirect"].startswith("/login/?next=")
    assert not Inspection.objects.filter(case=case).exists()


def test_login_page_renders_for_anonymous_visitors(client, db):
    response = client.get("/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content
    assert b'name="password"' in response.content


def test_login_through_the_form_lands_on_the_dashboard(client, member):
    response = client.post("/login/", {"username": "mallory", "password": "pw-mallory-1"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_every_page_renders_for_staff(client, viewer, case, ticket):
    client.force_login(viewer)
    for url in pages(case, ticket):
        response = client.get(url)
        assert response.status_code == 200, url
        assert is_full_page(response), url
        assert b"All times are UTC" in response.content


def test_unknown_records_are_404(client, member, db):
    client.force_login(member)
    missing = "00000000-0000-0000-0000-000000000000"
    for url in [
        f"/tickets/{missing}/",
        f"/recovery/{missing}/",
        "/traces/nope/",
        "/endpoints/no.such/",
    ]:
        assert client.get(url).status_code == 404, url


# --- htmx regions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("/", 'id="live"'),
        ("/tickets/", 'id="tickets"'),
        ("/endpoints/", 'id="endpoints"'),
        ("/recovery/", 'id="cases"'),
        ("/obligations/", 'id="obligations"'),
    ],
)
def test_htmx_requests_get_only_the_region(client, member, case, ticket, url, region):
    client.force_login(member)
    response = client.get(url, **HX)
    assert response.status_code == 200
    body = response.content.decode()
    assert not is_full_page(response)
    assert "topbar" not in body
    assert body.lstrip().startswith(f"<div {region}") or region in body
    assert "HX-Request" in response["Vary"]


def test_htmx_requests_for_detail_pages_get_only_their_region(client, viewer, case, ticket):
    client.force_login(viewer)
    for url, region in [
        (f"/tickets/{ticket.id}/", 'id="ticket"'),
        (f"/traces/{ticket.trace_id}/", 'id="tree"'),
        (f"/endpoints/{case.endpoint.address}/", 'id="live"'),
        (f"/recovery/{case.id}/", 'id="casework"'),
    ]:
        response = client.get(url, **HX)
        assert response.status_code == 200, url
        assert not is_full_page(response), url
        assert region in response.content.decode(), url


def test_a_history_restore_gets_the_whole_page(client, member, db):
    client.force_login(member)
    response = client.get("/tickets/", HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HX)
    assert is_full_page(response)


# --- Ticket list ------------------------------------------------------------------------------


def test_ticket_list_filters_by_state_endpoint_and_trace(client, viewer, case, ticket):
    client.force_login(viewer)
    by_state = client.get("/tickets/", {"state": "recovering"}).content.decode()
    assert str(case.ticket_id) in by_state
    assert str(ticket.id) not in by_state

    by_endpoint = client.get("/tickets/", {"endpoint": "con.echo"}).content.decode()
    assert str(ticket.id) in by_endpoint
    assert str(case.ticket_id) not in by_endpoint

    by_trace = client.get("/tickets/", {"trace_id": ticket.trace_id}).content.decode()
    assert str(ticket.id) in by_trace
    assert str(case.ticket_id) not in by_trace


def test_ticket_list_shows_short_ids_with_the_full_id_in_the_title(client, viewer, ticket):
    client.force_login(viewer)
    body = client.get("/tickets/").content.decode()
    # UUIDv7 heads are timestamps shared by a minute's tickets: the tail is shown.
    assert f'<code class="id" title="{ticket.id}">…{str(ticket.id)[-8:]}</code>' in body


def test_ticket_list_pages_by_keyset_cursor(client, viewer, echo, monkeypatch):
    monkeypatch.setattr(ticket_pages, "TICKETS_PAGE", 2)
    ids = [admit_ticket(endpoint=echo.address, input={"n": n}).ticket.id for n in range(3)]
    client.force_login(viewer)
    first = client.get("/tickets/", {"endpoint": "con.echo"}).content.decode()
    assert str(ids[2]) in first and str(ids[1]) in first
    assert str(ids[0]) not in first
    cursor = re.search(r'href="/tickets/\?[^"]*cursor=([^"&]+)', first).group(1)
    second = client.get("/tickets/", {"endpoint": "con.echo", "cursor": cursor}, **HX)
    body = second.content.decode()
    assert str(ids[0]) in body
    assert str(ids[2]) not in body
    assert "Older" not in body  # the last page
    # An older page holds still: only the first page watches and polls.
    assert "hx-trigger" not in body and "data-live-watch" not in body


def test_ticket_list_reports_bad_filters_instead_of_failing(client, member, db):
    client.force_login(member)
    for params in [{"state": "bogus"}, {"cursor": "!!!"}, {"endpoint": "no.such"}]:
        response = client.get("/tickets/", params, **HX)
        assert response.status_code == 400, params
        assert b'role="alert"' in response.content, params


def test_ticket_list_needs_a_bounded_number_of_queries(
    client, member, echo, django_assert_max_num_queries
):
    for n in range(15):
        admit_ticket(endpoint=echo.address, input={"n": n})
    client.force_login(member)
    with django_assert_max_num_queries(8):
        assert client.get("/tickets/").status_code == 200


# --- Ticket detail and approval ----------------------------------------------------------------


def test_ticket_detail_shows_turn_events_and_trace_link(client, viewer, case):
    client.force_login(viewer)
    body = client.get(f"/tickets/{case.ticket_id}/").content.decode()
    assert f"seq #{case.turn.seq}" in body
    assert "turn_uncertain" in body  # the timeline
    assert f'href="/traces/{case.ticket.trace_id}/"' in body
    assert "recovering" in body


@pytest.fixture
def submitter(db, django_user_model):
    """Submitted the gated ticket: sees it, owns nothing."""
    return django_user_model.objects.create_user("sam", password="pw-sam-1")


@pytest.fixture
def gated(submitter):
    ticket = finished_gated_ticket("con.gated", submitter=submitter)
    assert ticket.state == "succeeded"
    assert ticket.delivery_state == "awaiting_approval"
    return ticket


@pytest.fixture
def gate_owner(gated):
    return create_owner(username="gus", password="pw-gus-1", endpoints=["con.gated"])


def test_approve_button_only_for_owners(client, submitter, gate_owner, gated):
    url = f"/tickets/{gated.id}/"
    client.force_login(submitter)  # sees the ticket, owns nothing
    body = client.get(url).content.decode()
    assert "Approve result" not in body
    assert "Awaiting approval by an owner of con.gated" in body
    client.force_login(gate_owner)
    assert b"Approve result" in client.get(url).content


def test_non_owner_cannot_approve(client, submitter, member, gated):
    # The submitter sees the ticket but may not approve it: 403. A stranger
    # does not see it at all: 404, as for an unknown ticket.
    for user, status in ((submitter, 403), (member, 404)):
        client.force_login(user)
        response = client.post(f"/tickets/{gated.id}/approve/", **HX)
        assert response.status_code == status, user
        gated.refresh_from_db()
        assert gated.delivery_state == "awaiting_approval"
        assert gated.approved_at is None


def test_owner_approves_through_htmx(client, gate_owner, gated):
    client.force_login(gate_owner)
    response = client.post(f"/tickets/{gated.id}/approve/", **HX)
    assert response.status_code == 200
    assert not is_full_page(response)
    body = response.content.decode()
    assert "Result approved" in body
    assert "Approve result" not in body  # approved: the button is gone
    gated.refresh_from_db()
    assert gated.approved_by == gate_owner
    assert gated.delivery_state != "awaiting_approval"


def test_owner_approval_without_htmx_redirects_back(client, gate_owner, gated):
    client.force_login(gate_owner)
    response = client.post(f"/tickets/{gated.id}/approve/")
    assert response.status_code == 302
    assert response["Location"] == f"/tickets/{gated.id}/"
    assert b"Result approved" in client.get(response["Location"]).content


def test_refused_approval_shows_the_services_reason(client, owner, case):
    # The case's ticket is recovering, not finished: the service refuses.
    client.force_login(owner)
    response = client.post(f"/tickets/{case.ticket_id}/approve/", **HX)
    assert response.status_code == 422
    assert not is_full_page(response)
    assert "recovering" in alert_text(response)


# --- Traces -------------------------------------------------------------------------------------


def test_trace_page_nests_children_under_their_parent(client, viewer, echo):
    root = admit_ticket(endpoint=echo.address, input={"root": True}).ticket
    child = admit_ticket(endpoint=echo.address, input={"c": 1}, parent_id=root.id).ticket
    grandchild = admit_ticket(endpoint=echo.address, input={"g": 1}, parent_id=child.id).ticket
    client.force_login(viewer)
    body = client.get(f"/traces/{root.trace_id}/").content.decode()
    positions = [body.index(f'title="{t.id}"') for t in (root, child, grandchild)]
    assert positions == sorted(positions)
    spacer = '<span class="indent" aria-hidden="true"></span>'
    assert spacer * 2 in body and spacer * 3 not in body  # the grandchild sits two deep


# --- Endpoints, obligations, lessons -----------------------------------------------------------


def test_endpoint_pages_show_lock_queue_and_open_case(client, viewer, case, echo):
    admit_ticket(endpoint=echo.address, input={"queued": True})
    client.force_login(viewer)
    listing = client.get("/endpoints/").content.decode()
    assert f'href="/recovery/{case.id}/"' in listing
    detail = client.get(f"/endpoints/{case.endpoint.address}/").content.decode()
    assert "quarantined" in detail
    assert f'href="/recovery/{case.id}/"' in detail
    assert f"#{case.turn.seq}" in detail  # recent turns
    assert str(case.turn_id) in detail  # the lock stays with the uncertain turn


def test_no_page_prints_template_syntax(client, viewer, case, ticket):
    """A template comment spread over lines ({# ... #} is one line only) or a
    broken tag would reach the page as text."""
    client.force_login(viewer)
    for path in (
        "/",
        "/tickets/",
        f"/tickets/{ticket.id}/",
        f"/traces/{ticket.trace_id}/",
        "/endpoints/",
        f"/endpoints/{case.endpoint.address}/",
        f"/recovery/{case.id}/",
        "/obligations/",
        "/lessons/",
        "/workers/",
    ):
        body = client.get(path).content.decode()
        for token in ("{#", "#}", "{%", "%}", "{{", "}}"):
            assert token not in body, f"{path} prints {token!r}"


def test_dashboard_lists_quarantined_endpoints_with_their_case(client, viewer, case):
    client.force_login(viewer)
    body = client.get("/").content.decode()
    assert case.endpoint.address in body
    assert f'href="/recovery/{case.id}/"' in body


def test_dashboard_flags_a_held_slot_and_a_starved_endpoint(client, member, viewer, case, echo):
    from runtime import registry

    # One turns worker with one slot, its pool process still inside the
    # quarantined turn's callable (what a real worker records: registry).
    registry.register_worker(name="turns@a", host="a", pid=1, queues=["turns"], pool_size=1)
    registry.set_node("turns@a")
    try:
        registry.slot_busy(case.turn_id)
    finally:
        registry.set_node("")
    client.force_login(member)
    quiet = client.get("/").content.decode()
    assert 'data-flag="held"' in quiet and "1 worker slot held" in quiet
    assert 'data-flag="starved"' not in quiet  # nothing is queued yet

    admit_ticket(endpoint=echo.address, input={"n": 1})
    body = client.get("/").content.decode()
    assert 'data-flag="starved"' in body
    assert f'href="/endpoints/{echo.address}/"' in body.split('id="capacity-warning"')[1]
    assert 'href="/workers/"' not in body  # hosts and pids are for staff

    client.force_login(viewer)  # staff
    staff_body = client.get("/").content.decode()
    assert 'href="/workers/"' in staff_body.split('id="capacity-warning"')[1].split("</section>")[0]


def test_dashboard_has_no_capacity_flag_when_slots_are_free(client, viewer, echo):
    from runtime import registry

    registry.register_worker(name="turns@a", host="a", pid=1, queues=["turns"], pool_size=2)
    admit_ticket(endpoint=echo.address, input={"n": 1})
    client.force_login(viewer)
    assert 'id="capacity-warning"' not in client.get("/").content.decode()


def test_obligations_list_overdue_first(client, viewer, echo):
    later = admit_ticket(endpoint=echo.address, input={"n": 1}).ticket
    overdue = admit_ticket(endpoint=echo.address, input={"n": 2}).ticket
    # Fixture shortcut: the obligations sweep is not under test here.
    Ticket.objects.filter(id=overdue.id).update(
        obligation_due_at=timezone.now() - timedelta(minutes=5)
    )
    client.force_login(viewer)
    body = client.get("/obligations/").content.decode()
    assert body.index(str(overdue.id)) < body.index(str(later.id))
    assert "overdue" in body
    dashboard = client.get("/").content.decode()
    assert str(overdue.id) in dashboard
    assert str(later.id) not in dashboard.split("Recent tickets")[0]


# --- Recovery: forms for owners only -------------------------------------------------------------


def test_a_case_does_not_exist_for_a_non_owner(client, member, case):
    client.force_login(member)
    for kwargs in ({}, HX):  # the whole page and the region alike
        response = client.get(f"/recovery/{case.id}/", **kwargs)
        assert response.status_code == 404
        assert case.reason not in response.content.decode()
    listing = client.get("/recovery/").content.decode()
    assert str(case.id) not in listing


def test_owner_sees_the_forms(client, owner, case):
    client.force_login(owner)
    body = client.get(f"/recovery/{case.id}/").content.decode()
    assert f'action="/recovery/{case.id}/inspections/"' in body
    # No inspection yet: the decision form waits for one; the lesson waits
    # for a decision.
    assert "Take an inspection first" in body
    assert f'action="/recovery/{case.id}/lesson/"' not in body


def test_non_owner_posts_are_not_found_and_change_nothing(client, member, case):
    client.force_login(member)
    base = f"/recovery/{case.id}"
    assert client.post(f"{base}/inspections/", **HX).status_code == 404
    assert (
        client.post(
            f"{base}/decisions/",
            {"decision-action": "keep_quarantined", "decision-rationale": "x"},
            **HX,
        ).status_code
        == 404
    )
    assert (
        client.post(
            f"{base}/lesson/",
            {"lesson-what_failed": "a", "lesson-evidence": "b", "lesson-prevention": "c"},
        ).status_code
        == 404
    )
    assert not Inspection.objects.filter(case=case).exists()
    assert not Decision.objects.filter(case=case).exists()
    assert not Lesson.objects.filter(case=case).exists()


def test_anonymous_posts_are_sent_to_login(client, case):
    response = client.post(f"/recovery/{case.id}/inspections/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    assert not Inspection.objects.filter(case=case).exists()


def test_recovery_forms_need_post(client, owner, case):
    client.force_login(owner)
    assert client.get(f"/recovery/{case.id}/inspections/").status_code == 405


def test_owner_inspects_and_decides_through_htmx(client, owner, case):
    client.force_login(owner)
    base = f"/recovery/{case.id}"
    response = client.post(f"{base}/inspections/", **HX)
    assert response.status_code == 200
    assert not is_full_page(response)
    inspection = Inspection.objects.get(case=case)
    body = response.content.decode()
    assert inspection.sha256 in body
    assert "Inspection taken" in body  # the flash notice, swapped out of band
    assert 'hx-swap-oob="true"' in body
    assert f'<option value="{inspection.id}"' in body  # the decision form offers it

    response = client.post(
        f"{base}/decisions/",
        {
            "decision-action": "keep_quarantined",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "the worker host is unreachable; keep it closed",
            "decision-evidence": "",
        },
        **HX,
    )
    assert response.status_code == 200, response.content.decode()
    decision = Decision.objects.get(case=case)
    assert decision.action == "keep_quarantined"
    assert decision.inspection_id == inspection.id
    assert decision.actor == owner
    assert "the worker host is unreachable" in response.content.decode()


def test_decision_must_rest_on_an_inspection_of_this_case(client, owner, case):
    other = quarantined_case("con.stuck-two")
    # The same owner, now of both endpoints (create_owner resets the password,
    # so log in with the fresh row).
    owner = create_owner(
        username="olive", password="pw-olive-1", endpoints=[other.endpoint.address]
    )
    client.force_login(owner)
    client.post(f"/recovery/{case.id}/inspections/")
    client.post(f"/recovery/{other.id}/inspections/")
    foreign = Inspection.objects.get(case=other)
    response = client.post(
        f"/recovery/{case.id}/decisions/",
        {
            "decision-action": "keep_quarantined",
            "decision-inspection": str(foreign.id),
            "decision-rationale": "r",
        },
        **HX,
    )
    assert response.status_code == 422
    assert b"Select a valid choice" in response.content
    assert not Decision.objects.filter(case=case).exists()


def test_a_decision_raced_by_another_owner_shows_the_services_reason(client, owner, case):
    client.force_login(owner)
    client.post(f"/recovery/{case.id}/inspections/")
    inspection = Inspection.objects.get(case=case)
    # Another owner decides first, while this one still has the form open.
    staff = get_user_model().objects.create_user("sam", password="pw-sam-1", is_staff=True)
    recovery_services.decide(
        case_id=case.id,
        user=staff,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="first",
    )
    response = client.post(
        f"/recovery/{case.id}/decisions/",
        {
            "decision-action": "authorize_rerun",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "re-run it under a new identity",
        },
        **HX,
    )
    assert response.status_code == 422
    assert not is_full_page(response)
    assert 'id="casework"' in response.content.decode()
    assert "decided" in alert_text(response)
    # What the owner typed is kept, beside the reason it was refused.
    assert "re-run it under a new identity</textarea>" in response.content.decode()
    assert Decision.objects.filter(case=case).count() == 1


def test_owner_finalizes_and_writes_the_lesson_that_closes_the_case(client, owner, case):
    client.force_login(owner)
    base = f"/recovery/{case.id}"
    client.post(f"{base}/inspections/", **HX)
    inspection = Inspection.objects.get(case=case)
    response = client.post(
        f"{base}/decisions/",
        {
            "decision-action": "finalize_orphan",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "no stop evidence; accept the risk, no invented answer",
        },
        **HX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert f'action="{base}/decisions/"' not in body  # a decided case takes no more
    assert f'action="{base}/lesson/"' in body

    response = client.post(
        f"{base}/lesson/",
        {
            "lesson-what_failed": "the runner ignored interrupts",
            "lesson-evidence": "no heartbeat after the interrupt; no stop receipt",
            "lesson-prevention": "runners must poll interrupted()",
        },
        **HX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "the runner ignored interrupts" in body
    # Closed: no decision or lesson left to write; only a change to propose
    # from the lesson.
    assert f'action="{base}/lesson/"' not in body
    assert [m for m in re.findall(r'<form[^>]*action="([^"]+)"', body)] == [f"{base}/propose/"]
    case.refresh_from_db()
    assert case.state == "closed"
    assert "the runner ignored interrupts" in client.get("/lessons/").content.decode()


def test_empty_lesson_is_refused_with_field_errors(client, owner, case):
    client.force_login(owner)
    response = client.post(f"/recovery/{case.id}/lesson/", {"lesson-what_failed": "x"}, **HX)
    assert response.status_code == 422
    assert b"This field is required." in response.content
    assert not Lesson.objects.filter(case=case).exists()


def test_lesson_on_an_open_case_shows_the_services_reason(client, owner, case):
    client.force_login(owner)
    response = client.post(
        f"/recovery/{case.id}/lesson/",
        {"lesson-what_failed": "a", "lesson-evidence": "b", "lesson-prevention": "c"},
        **HX,
    )
    assert response.status_code == 422
    assert b"open" in response.content and b'role="alert"' in response.content
    assert not Lesson.objects.filter(case=case).exists()


def test_release_without_evidence_shows_the_services_reason(client, owner, case):
    client.force_login(owner)
    client.post(f"/recovery/{case.id}/inspections/")
    inspection = Inspection.objects.get(case=case)
    response = client.post(
        f"/recovery/{case.id}/decisions/",
        {
            "decision-action": "release",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "it stopped, I am sure",
        },
        **HX,
    )
    assert response.status_code == 422
    assert "evidence" in alert_text(response)  # the service's reason, in the form's region
    assert not Decision.objects.filter(case=case).exists()


def test_without_htmx_a_form_post_redirects_back_to_the_case(client, owner, case):
    client.force_login(owner)
    response = client.post(f"/recovery/{case.id}/inspections/")
    assert response.status_code == 302
    assert response["Location"] == f"/recovery/{case.id}/"
    assert b"Inspection taken" in client.get(response["Location"]).content


def test_decision_action_has_no_default(client, owner, case):
    client.force_login(owner)
    client.post(f"/recovery/{case.id}/inspections/")
    inspection = Inspection.objects.get(case=case)
    body = client.get(f"/recovery/{case.id}/").content.decode()
    assert '<option value="" selected>— choose an action —</option>' in body
    response = client.post(
        f"/recovery/{case.id}/decisions/",
        {"decision-inspection": str(inspection.id), "decision-rationale": "r"},
        **HX,
    )
    assert response.status_code == 422
    assert b"This field is required." in response.content
    assert not Decision.objects.filter(case=case).exists()


def test_dashboard_queries_do_not_grow_with_the_ledger(
    client, member, case, echo, django_assert_max_num_queries
):
    client.force_login(member)
    for n in range(25):
        admit_ticket(endpoint=echo.address, input={"n": n})
    # Capped counts per state, one read each for the other panels (the last
    # hour's admitted, finished and failures, and what awaits approval, too),
    # the capacity flags (the worker registry: a few rows per host), the
    # live region's change token (the ledger's newest event), the user's
    # theme (base.html) and the paused endpoints (one grouped read).
    with django_assert_max_num_queries(25):
        assert client.get("/").status_code == 200


def test_endpoint_pages_need_a_bounded_number_of_queries(
    client, member, case, echo, django_assert_max_num_queries
):
    client.force_login(member)
    for n in range(10):
        admit_ticket(endpoint=echo.address, input={"n": n})
    with django_assert_max_num_queries(8):
        assert client.get("/endpoints/").status_code == 200


def test_an_alias_redirects_to_the_canonical_endpoint_page(client, member, db):
    echo_endpoint("con.new-name", aliases=["con.old-name"])
    client.force_login(member)
    response = client.get("/endpoints/con.old-name/")
    assert response.status_code == 302
    assert response["Location"] == "/endpoints/con.new-name/"


def test_trace_ids_with_slashes_and_spaces_have_pages(client, viewer, echo):
    ticket = admit_ticket(endpoint=echo.address, input={}, trace_id="team/run 7").ticket
    client.force_login(viewer)
    body = client.get("/tickets/").content.decode()
    assert 'href="/traces/team/run%207/"' in body
    response = client.get("/traces/team/run%207/")
    assert response.status_code == 200
    assert f'title="{ticket.id}"' in response.content.decode()


def test_a_rerun_carries_the_obligation_and_links_to_its_original(client, owner, case):
    client.force_login(owner)
    client.post(f"/recovery/{case.id}/inspections/")
    inspection = Inspection.objects.get(case=case)
    client.post(
        f"/recovery/{case.id}/decisions/",
        {
            "decision-action": "authorize_rerun",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "the input is idempotent; run it again",
        },
    )
    rerun = Decision.objects.get(case=case).rerun_ticket
    assert rerun is not None and rerun.parent_id == case.ticket_id
    obligations = client.get("/obligations/").content.decode()
    assert f'title="{rerun.id}"' in obligations
    original = client.get(f"/tickets/{case.ticket_id}/").content.decode()
    assert f'href="/tickets/{rerun.id}/"' in original
    detail = client.get(f"/tickets/{rerun.id}/").content.decode()
    assert "Re-run of" in detail
    assert f'href="/tickets/{case.ticket_id}/"' in detail


# --- Obligations on the ticket page ------------------------------------------------------------


def test_obligation_form_only_for_owners(client, submitter, member, gate_owner, gated):
    url = f"/tickets/{gated.id}/"
    client.force_login(submitter)
    assert b"Close obligation" not in client.get(url).content
    for user, status in ((submitter, 403), (member, 404)):
        client.force_login(user)
        response = client.post(f"/tickets/{gated.id}/obligation/", {"action": "close", "note": "x"})
        assert response.status_code == status
        gated.refresh_from_db()
        assert gated.obligation_state == "open"
    client.force_login(gate_owner)
    assert b"Close obligation" in client.get(url).content


def test_owner_updates_then_closes_the_obligation_through_htmx(client, gate_owner, gated):
    client.force_login(gate_owner)
    url = f"/tickets/{gated.id}/obligation/"
    response = client.post(
        url,
        {"action": "update", "note": "waiting on legal", "next_update_at": "2099-01-02T03:04"},
        **HX,
    )
    assert response.status_code == 200 and not is_full_page(response)
    gated.refresh_from_db()
    assert gated.obligation_note == "waiting on legal"
    assert gated.obligation_due_at.isoformat().startswith("2099-01-02T03:04")
    response = client.post(url, {"action": "close", "note": "answered by phone"}, **HX)
    assert response.status_code == 200
    assert "Close obligation" not in response.content.decode()  # closed: no form
    gated.refresh_from_db()
    assert gated.obligation_state == "closed"


def test_refused_obligation_changes_show_the_reason(client, gate_owner, gated):
    client.force_login(gate_owner)
    url = f"/tickets/{gated.id}/obligation/"
    bad_date = client.post(url, {"action": "update", "next_update_at": "soon"}, **HX)
    assert bad_date.status_code == 422 and "not a date" in alert_text(bad_date)
    past = client.post(url, {"action": "update", "next_update_at": "2001-01-01T00:00"}, **HX)
    assert past.status_code == 422 and alert_text(past)
    no_note = client.post(url, {"action": "close"}, **HX)
    assert no_note.status_code == 422 and "note" in alert_text(no_note)
    gated.refresh_from_db()
    assert gated.obligation_state == "open"
