"""A re-run may change the input and the budget (within the endpoint's), and
the case page warns while it would repeat the turn that overran."""

from __future__ import annotations

import pytest

from console.owners import create_owner
from core.errors import Invalid
from recovery import services
from runtime import turns as runtime
from tests.console.helpers import quarantined_case
from tickets.models import Ticket, TicketEvent, Turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def case():
    return quarantined_case("hung.echo")


@pytest.fixture
def owner(case):
    return create_owner(username="olive", password="pw-olive-1", endpoints=["hung.echo"])


def test_a_rerun_runs_the_new_input_under_the_smaller_budget(case, owner):
    inspection = services.inspect_case(case_id=case.id, user=owner)
    decision = services.decide(
        case_id=case.id,
        user=owner,
        action="authorize_rerun",
        inspection_id=inspection.id,
        rationale="the input asked for too much; try a smaller one, briefly",
        rerun_input={"task": "small"},
        rerun_budget_s=4,
    )
    rerun = Ticket.objects.get(id=decision.rerun_ticket_id)
    assert (rerun.input, rerun.budget_s, rerun.rerun_of_id) == (
        {"task": "small"},
        4,
        case.ticket_id,
    )
    assert TicketEvent.objects.get(ticket_id=rerun.id, kind="budget_set").detail == {"budget_s": 4}
    runtime.run_ticket(ticket_id=rerun.id)
    turn = Turn.objects.get(ticket_id=rerun.id)
    assert (turn.deadline_at - turn.started_at).total_seconds() == pytest.approx(4)


def test_changes_are_refused_beyond_the_cap_or_for_another_action(case, owner):
    inspection = services.inspect_case(case_id=case.id, user=owner)
    cap = case.endpoint.turn_budget_s
    with pytest.raises(Invalid, match="budget_s must be 1 to"):
        services.decide(
            case_id=case.id,
            user=owner,
            action="authorize_rerun",
            inspection_id=inspection.id,
            rationale="r",
            rerun_budget_s=int(cap) + 1,
        )
    with pytest.raises(Invalid, match="only authorize_rerun takes them"):
        services.decide(
            case_id=case.id,
            user=owner,
            action="finalize_orphan",
            inspection_id=inspection.id,
            rationale="r",
            rerun_input={"task": "other"},
        )
    case.refresh_from_db()
    assert case.state == "open"


def test_the_case_page_warns_that_a_rerun_repeats_the_overrun(client, case, owner):
    services.inspect_case(case_id=case.id, user=owner)
    client.force_login(owner)
    body = client.get(f"/recovery/{case.id}/").content.decode()
    assert f"repeats turn #{case.turn.seq}" in body
    assert "Last outcome of this input on hung.echo" in body
    assert str(case.ticket_id)[:8] in body and "recovering" in body
    assert 'name="decision-rerun_budget_s"' in body and 'name="decision-rerun_input"' in body

    # Through the form: a smaller budget and a new input.
    inspection = case.inspections.get()
    response = client.post(
        f"/recovery/{case.id}/decisions/",
        {
            "decision-action": "authorize_rerun",
            "decision-inspection": str(inspection.id),
            "decision-rationale": "smaller input, shorter budget",
            "decision-rerun_input": '{"task": "tiny"}',
            "decision-rerun_budget_s": "3",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    rerun = Ticket.objects.get(rerun_of_id=case.ticket_id)
    assert (rerun.input, rerun.budget_s) == ({"task": "tiny"}, 3)
