"""The ``interrupt`` busy policy: a ticket admitted while a turn runs asks
that turn to stop through the budget's path (flag, grace, escalation,
quarantine if unproven); the stopped ticket fails ``superseded`` naming the
new one, which runs next. Real PostgreSQL; the integration tests a real
worker with beat (0.5 s sweeps)."""

from __future__ import annotations

import pytest

from core.errors import EndpointBusy
from endpoints.models import Endpoint
from recovery.models import RecoveryCase
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import wait_for
from tests.racing import race
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent, Turn

pytestmark = [pytest.mark.django_db(transaction=True)]


def state_of(ticket_id) -> str:
    return Ticket.objects.get(id=ticket_id).state


def _running(make_endpoint, **kw):
    endpoint = make_endpoint(path="runtime.demo.sleep", **kw)
    ticket = admit_ticket(endpoint=endpoint.address, input={}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    return endpoint, started.turn


def _interrupts(ticket_id):
    return list(TicketEvent.objects.filter(ticket_id=ticket_id, kind="interrupt_requested"))


# --- Admission and finish, no worker ---------------------------------------------------------


def test_an_admission_on_an_interrupt_endpoint_asks_the_running_turn_to_stop(make_endpoint):
    endpoint, turn = _running(make_endpoint, busy_policy="interrupt")
    new = admit_ticket(endpoint=endpoint.address, input={"n": 2}).ticket
    assert new.state == "queued"
    t = Turn.objects.get(id=turn.id)
    assert t.state == "interrupting" and t.interrupt_reason == "superseded"
    (event,) = _interrupts(turn.ticket_id)
    assert event.detail["by"] == str(new.id) and event.detail["seq"] == turn.seq
    assert event.actor == f"ticket:{new.id}"
    # The stop, as the worker finishes it: the ticket fails superseded, by the new one.
    done = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=runtime.Outcome.stopped("runner_returned"),
        source="worker",
    )
    assert done.ticket_state == "failed"
    old = Ticket.objects.get(id=turn.ticket_id)
    assert old.error["code"] == "superseded" and old.error["by"] == str(new.id)
    assert Turn.objects.get(id=turn.id).state == "stopped"
    # The lock went to the queue: the new ticket is next.
    assert EndpointLock.objects.get(endpoint=endpoint).holder_id is None
    started = runtime.start_turn(ticket_id=new.id)
    assert started is not None and started.turn.ticket_id == new.id


@pytest.mark.parametrize("policy", ["enqueue", "reject"])
def test_other_policies_never_interrupt(make_endpoint, policy):
    endpoint, turn = _running(make_endpoint, busy_policy=policy)
    if policy == "reject":
        with pytest.raises(EndpointBusy):
            admit_ticket(endpoint=endpoint.address, input={"n": 2})
    else:
        assert admit_ticket(endpoint=endpoint.address, input={"n": 2}).ticket.state == "queued"
    assert Turn.objects.get(id=turn.id).state == "running"
    assert not _interrupts(turn.ticket_id)


def test_a_paused_interrupt_endpoint_queues_and_lets_its_turn_finish(make_endpoint, staff_user):
    endpoint, turn = _running(make_endpoint, busy_policy="interrupt")
    runtime_services.pause_endpoint(address=endpoint.address, user=staff_user, reason="upkeep")
    new = admit_ticket(endpoint=endpoint.address, input={"n": 2}).ticket
    assert new.state == "queued"
    assert Turn.objects.get(id=turn.id).state == "running"
    assert not _interrupts(turn.ticket_id)


def test_a_later_admission_does_not_supersede_what_was_queued(make_endpoint):
    """Each admission supersedes the turn running at it, not a queued ticket:
    the second finds the turn already stopping and asks nothing more."""
    endpoint, turn = _running(make_endpoint, busy_policy="interrupt")
    first = admit_ticket(endpoint=endpoint.address, input={"n": 1}).ticket
    second = admit_ticket(endpoint=endpoint.address, input={"n": 2}).ticket
    (event,) = _interrupts(turn.ticket_id)
    assert event.detail["by"] == str(first.id)
    assert state_of(first.id) == state_of(second.id) == "queued"


# --- A real worker ----------------------------------------------------------------------------


@pytest.mark.integration
def test_two_racers_stop_the_running_turn_and_run_one_after_the_other(worker, make_endpoint):
    make_endpoint("chat", path="runtime.demo.sleep", busy_policy="interrupt", interrupt_grace_s=5)
    running = admit_ticket(endpoint="chat", input={"seconds": 60}).ticket
    wait_for(lambda: state_of(running.id) == "running", timeout=30, message="the first turn")
    racers = race(
        lambda: admit_ticket(endpoint="chat", input={"seconds": 1, "racer": 1}).ticket.id,
        lambda: admit_ticket(endpoint="chat", input={"seconds": 1, "racer": 2}).ticket.id,
    )
    wait_for(lambda: state_of(running.id) == "failed", timeout=20, message="the stop")
    old = Ticket.objects.get(id=running.id)
    assert old.error["code"] == "superseded" and old.error["by"] in map(str, racers)
    stopped = Turn.objects.get(ticket_id=running.id)
    assert stopped.state == "stopped" and stopped.interrupt_reason == "superseded"
    # Evidence: the runner returned after the flag (the cooperative stop).
    assert stopped.stop_evidence["kind"] == "runner_returned"
    assert stopped.stop_evidence["seq"] == stopped.seq
    # Within its grace: the flag stopped it, no escalation was needed.
    stop_s = (stopped.ended_at - stopped.interrupt_requested_at).total_seconds()
    assert stop_s < 5, stop_s
    print(f"superseded turn stopped {stop_s:.3f} s after the request")
    # One request reached the turn; the other found it stopping.
    (event,) = _interrupts(running.id)
    assert event.detail["by"] == old.error["by"]

    wait_for(
        lambda: all(state_of(r) == "succeeded" for r in racers),
        timeout=30,
        message="both racers to run",
    )
    turns = sorted(Turn.objects.filter(ticket_id__in=racers), key=lambda t: t.seq)
    # Exactly one ran next (the seq right after the stopped turn), in the
    # queue's order, and the other only after it ended: neither superseded
    # the other, neither was cancelled.
    assert [t.seq for t in turns] == [stopped.seq + 1, stopped.seq + 2]
    assert turns[0].ticket_id == min(racers)
    assert turns[0].started_at >= stopped.ended_at
    assert turns[1].started_at >= turns[0].ended_at
    assert all(t.state == "completed" and not t.interrupt_reason for t in turns)
    for r in racers:
        assert Ticket.objects.get(id=r).result["interrupted"] is False
    assert Endpoint.objects.get(address="chat").state == "available"
    assert not RecoveryCase.objects.exists()


@pytest.mark.integration
def test_an_uncooperative_turn_superseded_is_quarantined_as_an_overrun(celery_procs, make_endpoint):
    worker = celery_procs
    worker.worker_and_beat()
    make_endpoint(
        "stubborn-chat",
        path="runtime.demo.stuck",
        busy_policy="interrupt",
        turn_budget_s=120,
        interrupt_grace_s=1,
    )
    stuck = admit_ticket(endpoint="stubborn-chat", input={"seconds": 8}).ticket
    wait_for(lambda: state_of(stuck.id) == "running", timeout=60, message="the stuck turn")
    new = admit_ticket(endpoint="stubborn-chat", input={"seconds": 0}).ticket
    case = wait_for(
        lambda: RecoveryCase.objects.filter(endpoint__address="stubborn-chat").first(),
        timeout=30,
        message="a recovery case",
    )
    assert str(case.ticket_id) == str(stuck.id)
    assert "interrupted for superseded" in case.reason and "no stop evidence" in case.reason
    turn = Turn.objects.get(ticket_id=stuck.id)
    assert turn.state == "uncertain" and turn.interrupt_reason == "superseded"
    assert state_of(stuck.id) == "recovering"
    assert Endpoint.objects.get(address="stubborn-chat").state == "quarantined"
    (event,) = _interrupts(stuck.id)
    assert event.detail["by"] == str(new.id)
    # The uncertain turn keeps the lock: the superseding ticket waits for an owner.
    assert EndpointLock.objects.get(endpoint__address="stubborn-chat").holder_id == turn.id
    assert state_of(new.id) == "queued"


# --- The directory: API and console ------------------------------------------------------------


def test_the_api_and_the_console_form_take_the_interrupt_policy(api, make_endpoint):
    from console.forms import ChangeForm

    body = {"address": "chatty", "runner": {"kind": "python", "path": "runtime.demo.echo"}}
    resp = api.post("/endpoints", {**body, "busy_policy": "interrupt"})
    assert resp.status_code == 201, resp.content
    assert resp.json()["busy_policy"] == "interrupt"
    assert api.patch("/endpoints/chatty", {"busy_policy": "reject"}).json()["busy_policy"] == (
        "reject"
    )
    bad = api.patch("/endpoints/chatty", {"busy_policy": "rollback"})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid"
    endpoint = Endpoint.objects.get(address="chatty")
    form = ChangeForm.for_endpoint(endpoint)
    data = {f"change-{k}": v for k, v in form.initial.items()}
    data.update({"change-busy_policy": "interrupt", "change-requires_approval": "no"})
    data["change-reason"] = "a person corrects the agent mid-turn"
    bound = ChangeForm(data=data, prefix="change")
    assert bound.is_valid(), bound.errors
    assert bound.changes(endpoint) == {"busy_policy": "interrupt"}
