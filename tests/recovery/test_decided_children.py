"""What a decided child owes its waiting parent (DESIGN.md flow 7).

A ``demo.research`` parent waits on two children; one child's turn is
quarantined. Each decision is checked for what reaches the parent:
``finalize_orphan`` and ``release`` send the child's one callback at once with
its final state and no result; ``authorize_rerun`` passes the callback to the
re-run, which answers the parent under the original child's callback key;
``keep_quarantined`` sends nothing. Driven in-process through the runtime's
own steps (start, interrupt, quarantine, run): no state field set by hand.
"""

from __future__ import annotations

import pytest

from recovery.services import decide, inspect_case
from runtime import turns as runtime
from tests.recovery.conftest import drive_to_quarantine
from tickets.admission import admit_ticket
from tickets.callbacks import callback_key
from tickets.models import (
    Callback,
    CallbackState,
    Delivery,
    ObligationState,
    Ticket,
    TicketEvent,
    TicketState,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def family(make_endpoint, stuck_endpoint, owner):
    """A research parent waiting on two children of a stuck endpoint; the
    first child's turn is quarantined, the second has not run yet."""
    make_endpoint("fam.research", path="runtime.demo.research", owners=[owner.username])
    children_ep = stuck_endpoint("fam.child")
    parent = admit_ticket(
        endpoint="fam.research",
        input={
            "children": 2,
            "child_endpoint": children_ep.address,
            # The re-run and the second child sleep this long, inline.
            "child_input": {"seconds": 0.05},
        },
        dedupe_key="parent",
        actor="test",
    ).ticket
    runtime.run_ticket(ticket_id=parent.id)  # the parent's turn dispatches the children
    parent.refresh_from_db()
    assert parent.state == TicketState.WAITING
    first, second = Ticket.objects.filter(parent=parent).order_by("id")
    quarantined = drive_to_quarantine(first.id)
    return parent, first, second, quarantined


def run_queued(address: str) -> None:
    """Run every queued ticket of an endpoint, oldest first, in-process."""
    while (
        ticket := Ticket.objects.filter(endpoint__address=address, state=TicketState.QUEUED)
        .order_by("id")
        .first()
    ) is not None:
        runtime.run_ticket(ticket_id=ticket.id)


def decide_on(case, owner, action: str, **kw):
    inspection = inspect_case(case_id=case.id, user=owner)
    return decide(
        case_id=case.id,
        user=owner,
        action=action,
        inspection_id=inspection.id,
        rationale=f"test decides {action}",
        **kw,
    )


@pytest.mark.parametrize(
    ("action", "final_state", "extra"),
    [
        ("finalize_orphan", TicketState.ORPHANED, {}),
        ("release", TicketState.FAILED, {"evidence": "the worker host was rebooted"}),
    ],
)
def test_finalize_or_release_of_a_child_sends_its_one_callback_at_once(
    family, owner, action, final_state, extra
):
    parent, first, second, q = family
    decide_on(q.case, owner, action, **extra)

    first.refresh_from_db()
    assert first.state == final_state and first.result is None
    callback = Callback.objects.get(source=first)
    payload = callback.ticket.input["callback"]
    assert payload["source"] == str(first.id)
    assert payload["state"] == final_state
    assert payload["result"] is None  # never an invented response
    assert callback.ticket.dedupe_key == callback_key(first.id)

    # The other child finishes; the parent's own code completes it.
    run_queued("fam.child")
    run_queued("fam.research")
    parent.refresh_from_db()
    assert parent.state == TicketState.SUCCEEDED
    states = {c["id"]: c["state"] for c in parent.result["children"]}
    assert states == {str(first.id): final_state, str(second.id): TicketState.SUCCEEDED}


def test_rerun_of_a_child_answers_the_waiting_parent(family, owner):
    parent, first, second, q = family
    decision = decide_on(q.case, owner, "authorize_rerun")
    rerun = decision.rerun_ticket

    first.refresh_from_db()
    assert first.state == TicketState.ORPHANED
    # The original sends nothing: its callback passed to the re-run.
    assert not Callback.objects.filter(source=first).exists()
    assert first.callback_state == CallbackState.NONE
    assert TicketEvent.objects.filter(
        ticket=first, kind="callback_passed", detail__rerun=str(rerun.id)
    ).exists()
    # The re-run inherits where to answer; it is not a root of its own.
    assert rerun.return_to_id == first.return_to_id
    assert rerun.continuation == first.continuation
    assert rerun.callback_state == CallbackState.PENDING
    assert rerun.obligation_state == ObligationState.NONE

    run_queued("fam.child")  # the re-run and the second child succeed
    rerun.refresh_from_db()
    assert rerun.state == TicketState.SUCCEEDED
    callback = Callback.objects.get(source=rerun)
    # One callback for the original child, under the original's key.
    assert callback.ticket.dedupe_key == callback_key(first.id)
    assert callback.ticket.input["callback"]["source"] == str(first.id)
    assert callback.ticket.input["callback"]["answered_by"] == str(rerun.id)
    # A child's re-run answers through the callback, never a delivery of its own.
    assert not Delivery.objects.filter(ticket_id=rerun.id).exists()

    run_queued("fam.research")
    parent.refresh_from_db()
    assert parent.state == TicketState.SUCCEEDED
    by_id = {c["id"]: c for c in parent.result["children"]}
    # The parent sees its child answered by the re-run, with the re-run's result.
    assert by_id[str(first.id)]["state"] == TicketState.SUCCEEDED
    assert by_id[str(first.id)]["result"] == rerun.result
    assert by_id[str(second.id)]["state"] == TicketState.SUCCEEDED


def test_rerun_of_a_child_waits_for_the_rerun_before_the_parent_completes(family, owner):
    parent, first, second, q = family
    decide_on(q.case, owner, "authorize_rerun")
    # The second child finishes first; its callback must not complete the
    # parent while the re-run of the first is still queued.
    runtime.run_ticket(ticket_id=second.id)
    run_queued("fam.research")
    parent.refresh_from_db()
    assert parent.state == TicketState.WAITING


def test_keep_quarantined_sends_nothing_yet(family, owner):
    parent, first, second, q = family
    decide_on(q.case, owner, "keep_quarantined")
    first.refresh_from_db()
    assert first.state == TicketState.RECOVERING
    assert first.callback_state == CallbackState.PENDING
    assert not Callback.objects.filter(source=first).exists()
    parent.refresh_from_db()
    assert parent.state == TicketState.WAITING
