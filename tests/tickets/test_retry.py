"""Retry (tickets/retry.py): a failed, cancelled or orphaned ticket admitted
again as a new ticket that names it, once, with an optional new input and a
budget within the endpoint's; refused with the reason otherwise."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from accounts.keys import create_api_key
from core.errors import EndpointQuarantined, Invalid, InvalidTransition, NotFound
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets import selectors
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketEvent, Turn
from tickets.retry import retry_ticket

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(django_user_model):
    return {
        name: django_user_model.objects.create_user(name)
        for name in ("alice", "bob", "olive", "mallory")
    }


def _failed(address: str, submitter) -> Ticket:
    ticket = admit_ticket(endpoint=address, input={"n": 1}, submitter=submitter).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.select_related("endpoint").get(id=ticket.id)
    assert ticket.state == "failed"
    return ticket


def test_a_retry_links_both_ways_and_its_turn_keeps_the_smaller_budget(make_endpoint, people):
    make_endpoint("flaky", path="runtime.demo.fail", owners=["olive"], turn_budget_s=60)
    original = _failed("flaky", people["alice"])

    retry = retry_ticket(
        ticket_id=original.id,
        user=people["olive"],
        reason="upstream fixed",
        input={"n": 2},
        budget_s=7,
    )
    assert (retry.state, retry.input, retry.budget_s) == ("queued", {"n": 2}, 7)
    assert retry.retry_of_id == original.id and retry.trace_id == original.trace_id
    # The submitter still sees it: it is theirs, retried on their behalf.
    assert retry.submitted_by_id == people["alice"].id
    assert selectors.ticket_payload(original)["retry"] == str(retry.id)
    assert selectors.ticket_payload(retry)["retry_of"] == str(original.id)
    nodes = selectors.lineage(original, user=people["olive"])["nodes"]
    assert {n["id"]: n["retry_of"] for n in nodes} == {
        str(original.id): None,
        str(retry.id): str(original.id),
    }
    kinds = {
        (e.ticket_id, e.kind): e.detail
        for e in TicketEvent.objects.filter(kind__in=["retried", "retry_of"])
    }
    assert kinds[(original.id, "retried")]["retry"] == str(retry.id)
    assert kinds[(retry.id, "retry_of")]["reason"] == "upstream fixed"

    runtime.run_ticket(ticket_id=retry.id)
    turn = Turn.objects.get(ticket_id=retry.id)
    assert (turn.deadline_at - turn.started_at).total_seconds() == pytest.approx(7)
    # Without an override the endpoint's budget holds.
    again = retry_ticket(ticket_id=retry.id, user=people["alice"], reason="once more")
    runtime.run_ticket(ticket_id=again.id)
    turn = Turn.objects.get(ticket_id=again.id)
    assert (turn.deadline_at - turn.started_at).total_seconds() == pytest.approx(60)
    assert again.input == {"n": 2}  # a retry's input, kept


def test_refusals_say_why_and_write_nothing(make_endpoint, people):
    make_endpoint("flaky", path="runtime.demo.fail", owners=["olive"], turn_budget_s=30)
    make_endpoint("fine", owners=["olive"])
    original = _failed("flaky", people["alice"])
    done = admit_ticket(endpoint="fine", input={}, submitter=people["alice"]).ticket
    runtime.run_ticket(ticket_id=done.id)
    before = Ticket.objects.count()

    with pytest.raises(InvalidTransition, match="succeeded: only a failed, cancelled or orphaned"):
        retry_ticket(ticket_id=done.id, user=people["olive"], reason="r")
    with pytest.raises(Invalid, match="1 to 30 seconds"):
        retry_ticket(ticket_id=original.id, user=people["olive"], reason="r", budget_s=31)
    with pytest.raises(Invalid, match="reason is required"):
        retry_ticket(ticket_id=original.id, user=people["olive"], reason="  ")
    with pytest.raises(Invalid, match="JSON object"):
        retry_ticket(ticket_id=original.id, user=people["olive"], reason="r", input=[1])
    # A stranger learns nothing; seeing is not enough to retry someone else's.
    with pytest.raises(NotFound):
        retry_ticket(ticket_id=original.id, user=people["mallory"], reason="r")
    bobs = admit_ticket(endpoint="fine", input={"x": 1}, submitter=people["bob"]).ticket
    runtime_services.cancel_ticket(ticket_id=bobs.id, actor="test", reason="r")
    with pytest.raises(NotFound):
        retry_ticket(ticket_id=bobs.id, user=people["alice"], reason="r")
    assert Ticket.objects.count() == before + 1

    first = retry_ticket(ticket_id=original.id, user=people["alice"], reason="mine")
    with pytest.raises(InvalidTransition, match=f"already retried as {first.id}"):
        retry_ticket(ticket_id=original.id, user=people["olive"], reason="again")


def test_a_quarantined_endpoint_refuses_the_retry(make_endpoint, people):
    """A cancelled ticket whose endpoint another turn quarantined: admission
    fails closed (423, naming the case); the uncertain ticket itself is
    recovering, not retryable."""
    make_endpoint("held", owners=["olive"], interrupt_grace_s=0.05)
    stuck = admit_ticket(endpoint="held", input={"task": "stuck"}).ticket
    waiting = admit_ticket(endpoint="held", input={"task": "next"}).ticket
    runtime_services.cancel_ticket(ticket_id=waiting.id, actor="test", reason="r")
    started = runtime.start_turn(ticket_id=stuck.id)
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id), timeout=5, message="grace"
    )
    with pytest.raises(EndpointQuarantined) as refused:
        retry_ticket(ticket_id=waiting.id, user=people["olive"], reason="r")
    assert refused.value.extra.get("case") == str(case_id)
    with pytest.raises(InvalidTransition, match="recovering"):
        retry_ticket(ticket_id=stuck.id, user=people["olive"], reason="r")
    assert not Ticket.objects.filter(retry_of__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_ticket_make_one_retry(make_endpoint, people):
    """Eight clicks at once (threads on a barrier, real PostgreSQL): one
    retry; the others are refused naming it."""
    make_endpoint("flaky", path="runtime.demo.fail", owners=["olive"])
    original = _failed("flaky", people["alice"])
    barrier = threading.Barrier(8)
    made, refused = [], []

    def click():
        try:
            barrier.wait()
            made.append(retry_ticket(ticket_id=original.id, user=people["olive"], reason="r").id)
        except InvalidTransition as exc:
            refused.append(exc.detail)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(refused) == 7
    assert all(f"already retried as {made[0]}" in r for r in refused)
    assert Ticket.objects.filter(retry_of_id=original.id).count() == 1


def test_the_api_route_retries_and_refuses_with_the_documented_codes(make_endpoint, api, people):
    make_endpoint("flaky", path="runtime.demo.fail", owners=["olive"], turn_budget_s=20)
    alice = api.as_key(create_api_key(username="alice")[1])
    mallory = api.as_key(create_api_key(username="mallory")[1])
    original = _failed("flaky", people["alice"])

    assert mallory.post(f"/tickets/{original.id}/retry", {"reason": "r"}).status_code == 404
    bad = alice.post(f"/tickets/{original.id}/retry", {"reason": "r", "budget_s": 99})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid"
    assert alice.post(f"/tickets/{original.id}/retry", {}).status_code in (400, 422)
    made = alice.post(
        f"/tickets/{original.id}/retry", {"reason": "r", "input": {"n": 5}, "budget_s": 5}
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["retry_of"], body["input"], body["budget_s"]) == (str(original.id), {"n": 5}, 5)
    assert alice.get(f"/tickets/{original.id}").json()["retry"] == body["id"]
    again = alice.post(f"/tickets/{original.id}/retry", {"reason": "r"})
    assert again.status_code == 409 and again.json()["error"] == "invalid_transition"
