"""``act`` (console/views/common.py), the one way a console view calls a
service for a POST, seen through real views: a refusal (a form that does
not validate, or a domain error from the service) is the form's page or
region again, 422, with the message; done, the htmx region or a redirect
(client-side for htmx, post/redirect/get otherwise)."""

from __future__ import annotations

import html
import re
import uuid

from console.owners import create_owner
from endpoints.models import Endpoint, EndpointEvent
from runtime.services import cancel_ticket
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketState

from .helpers import echo_endpoint

HX = {"HTTP_HX_REQUEST": "true"}


def _text(response) -> str:
    return response.content.decode()


def _flash(response, level: str) -> list[str]:
    found = re.findall(rf'class="flash flash-{level}"[^>]*>([^<]*)<', _text(response))
    return [html.unescape(text) for text in found]


def _owner(address: str):
    echo_endpoint(address)
    return create_owner(username="olive", password="pw-olive-1", endpoints=[address])


def test_a_refused_action_is_its_region_again_with_the_reason_and_422(client, db):
    olive = _owner("act.cancel")
    ticket = admit_ticket(endpoint="act.cancel", input={"n": 1}).ticket
    client.force_login(olive)

    # The view's own check (no reason), before any service is called.
    blank = client.post(f"/tickets/{ticket.id}/cancel/", {"reason": " "}, **HX)
    assert blank.status_code == 422
    assert "<html" not in _text(blank) and 'id="ticket"' in _text(blank)
    assert "A reason is required." in _text(blank)
    assert Ticket.objects.get(id=ticket.id).cancel_requested_at is None

    # The service's refusal: a cancelled ticket cannot be cancelled again.
    cancel_ticket(ticket_id=ticket.id, actor="test", reason="first")
    again = client.post(f"/tickets/{ticket.id}/cancel/", {"reason": "again"}, **HX)
    assert again.status_code == 422
    assert "cancelled" in _text(again)
    assert Ticket.objects.get(id=ticket.id).state == TicketState.CANCELLED


def test_done_is_the_region_for_htmx_and_a_redirect_otherwise(client, db):
    olive = _owner("act.done")
    first = admit_ticket(endpoint="act.done", input={"n": 1}).ticket
    second = admit_ticket(endpoint="act.done", input={"n": 2}).ticket
    client.force_login(olive)

    region = client.post(f"/tickets/{first.id}/cancel/", {"reason": "not needed"}, **HX)
    assert region.status_code == 200
    assert "<html" not in _text(region) and 'id="ticket"' in _text(region)
    # The flash rides along out of band, so it shows at once.
    assert 'hx-swap-oob="true"' in _text(region)
    assert _flash(region, "success") == ["Cancel recorded."]

    plain = client.post(f"/tickets/{second.id}/cancel/", {"reason": "not needed"})
    assert plain.status_code == 302 and plain["Location"] == f"/tickets/{second.id}/"
    assert _flash(client.get(plain["Location"]), "success") == ["Cancel recorded."]
    assert Ticket.objects.get(id=second.id).state == TicketState.CANCELLED


def test_without_a_region_htmx_is_redirected_client_side(client, db):
    olive = _owner("act.retry")
    ticket = admit_ticket(endpoint="act.retry", input={"n": 1}).ticket
    cancel_ticket(ticket_id=ticket.id, actor="test", reason="stop")
    client.force_login(olive)

    response = client.post(f"/tickets/{ticket.id}/retry/", {"reason": "again"}, **HX)
    new = Ticket.objects.get(retry_of_id=ticket.id)
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/tickets/{new.id}/"
    assert _flash(client.get(response["HX-Redirect"]), "success") == [
        f"Retried as ticket {new.id}."
    ]


def test_a_refusal_without_an_error_slot_is_the_page_with_a_notice(client, db):
    olive = _owner("act.pause")
    client.force_login(olive)

    refused = client.post("/endpoints/act.pause/pause/", {"action": "pause", "reason": ""})
    assert refused.status_code == 422
    assert "<html" in _text(refused)  # a plain form: the whole page again
    assert _flash(refused, "error") == ["a pause needs a reason"]
    assert Endpoint.objects.get(address="act.pause").paused_at is None

    done = client.post("/endpoints/act.pause/pause/", {"action": "pause", "reason": "keys"})
    assert done.status_code == 302 and done["Location"] == "/endpoints/act.pause/"
    assert EndpointEvent.objects.filter(endpoint__address="act.pause", kind="paused").count() == 1
    # A level other than success: nothing changed the second time.
    again = client.post("/endpoints/act.pause/pause/", {"action": "pause", "reason": "keys"})
    assert again.status_code == 302
    assert _flash(client.get(again["Location"]), "info") == ["It was already paused."]


def test_a_form_that_does_not_validate_is_refused_before_the_service(client, db):
    olive = _owner("act.gov")
    client.force_login(olive)
    response = client.post(
        "/endpoints/act.gov/rollback/", {"to_generation": 1, "generation": 1, "reason": ""}
    )
    assert response.status_code == 422
    assert "a rollback needs a reason" in _text(response)


def test_an_unknown_object_is_404_where_the_view_says_so(client, db, django_user_model):
    olive = _owner("act.agent")
    client.force_login(olive)
    # The agent's approval: a call that is not waiting is not there.
    response = client.post(
        f"/endpoints/act.agent/approvals/{uuid.uuid4()}/call-1/",
        {"decision": "approve", "reason": "fine"},
    )
    assert response.status_code == 404
    # Elsewhere a NotFound is the service's refusal, shown where it was asked.
    staff = django_user_model.objects.create_user("sam", is_staff=True)
    client.force_login(staff)
    refused = client.post("/workers/nowhere@host/consuming/", {"action": "stop", "reason": "x"})
    assert refused.status_code == 422
    assert _flash(refused, "error") == ["worker 'nowhere@host' not found"]
