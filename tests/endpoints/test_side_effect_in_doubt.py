"""A process-isolated turn that ends without an outcome while a
side-effecting tool call it recorded has no end (the process died, or the
escalation killed it) becomes a recovery case, never a failure anyone may
retry; with no such call open it fails ``runner_died`` as before. The
owner's decision, then a retry, hand the call in doubt to the next turn.
Turns run in this process (the supervisor), real PostgreSQL."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from core.errors import InvalidTransition
from endpoints.services import create_endpoint
from recovery.models import RecoveryCase
from recovery.services import decide, inspect_case
from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn
from tickets.retry import retry_ticket

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "tests.endpoints.doubt_runners."


def run(address: str, name: str, **endpoint) -> Ticket:
    create_endpoint(address=address, runner={"kind": "python", "path": PATH + name}, **endpoint)
    ticket = admit_ticket(endpoint=address, input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    return Ticket.objects.get(id=ticket.id)


@pytest.fixture
def boss():
    return get_user_model().objects.create_user("boss", is_staff=True)


def test_a_died_process_with_no_side_effect_open_stays_a_plain_failure():
    ticket = run("doubt.lookup", "looks_up_and_dies")
    assert ticket.state == "failed" and ticket.error["code"] == "runner_died"
    assert ticket.error["signal"] == "SIGKILL"
    assert not RecoveryCase.objects.exists()


def test_a_died_process_mid_side_effect_is_a_case_and_a_retry_later_sees_the_key(boss):
    ticket = run("doubt.dies", "charges_and_dies")
    case = RecoveryCase.objects.get(ticket=ticket)
    turn = Turn.objects.get(ticket=ticket)
    assert ticket.state == "recovering" and turn.state == "uncertain"
    assert case.endpoint.state == "quarantined"
    assert f"key-of-{turn.id}" in case.reason and "SIGKILL" in case.reason
    event = ticket.events.get(kind="turn_uncertain")
    [call] = event.detail["side_effect_in_doubt"]
    assert call["tool"] == "charge" and call["idempotency_key"] == f"key-of-{turn.id}"
    assert event.detail["process_exit"]["signal"] == "SIGKILL"
    with pytest.raises(InvalidTransition) as refused:
        retry_ticket(ticket_id=ticket.id, user=boss, reason="again")
    assert refused.value.extra["case"] == str(case.id)

    # The owner gives up on it; a later retry still carries the key in doubt.
    inspection = inspect_case(case_id=case.id, user=boss)
    decide(
        case_id=case.id,
        user=boss,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="the customer will be asked",
    )
    again = retry_ticket(ticket_id=ticket.id, user=boss, reason="the customer said go")
    runtime.run_ticket(ticket_id=again.id)
    again.refresh_from_db()
    assert again.state == "succeeded", again.error
    [doubt] = again.result["in_doubt"]
    assert doubt["idempotency_key"] == f"key-of-{turn.id}" and doubt["ticket"] == str(ticket.id)


def test_a_process_the_escalation_kills_mid_side_effect_is_a_case():
    ticket = run(
        "doubt.hangs",
        "charges_and_hangs",
        turn_budget_s=1,
        interrupt_grace_s=0.3,
    )
    assert ticket.state == "recovering", ticket.error
    case = RecoveryCase.objects.get(ticket=ticket)
    assert case.endpoint.state == "quarantined" and "SIGKILL" in case.reason
