"""The runtime in-process against real PostgreSQL: artifacts, history,
children, resume attribution."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.core.files.storage import default_storage

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import ContextEntry, EndpointLock, Ticket, Turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def artifacts_dir(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    return tmp_path


def test_a_result_over_the_cap_is_stored_as_an_artifact_with_a_pointer(
    make_endpoint, settings, artifacts_dir
):
    settings.TICKET_MAX_RESULT_BYTES = 1000
    make_endpoint("big")
    ticket = admit_ticket(endpoint="big", input={"blob": "y" * 5000}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "succeeded"
    [pointer] = t.artifacts
    body = json.dumps({"echo": {"blob": "y" * 5000}}, sort_keys=True, separators=(",", ":"))
    assert pointer["sha256"] == hashlib.sha256(body.encode()).hexdigest()
    assert pointer["bytes"] == len(body) and pointer["media_type"] == "application/json"
    assert t.result == {"artifact": pointer["uri"], "bytes": len(body), "sha256": pointer["sha256"]}
    name = pointer["uri"].removeprefix("artifact://")
    with default_storage.open(name) as f:
        assert f.read().decode() == body


def test_a_result_under_the_cap_stays_inline(make_endpoint):
    make_endpoint("small")
    ticket = admit_ticket(endpoint="small", input={"x": 1}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    t = Ticket.objects.get(id=ticket.id)
    assert t.result == {"echo": {"x": 1}} and t.artifacts == []


def test_each_completed_turn_appends_to_the_endpoint_history(make_endpoint):
    make_endpoint("hist")
    for i in range(3):
        ticket = admit_ticket(endpoint="hist", input={"i": i}).ticket
        runtime.run_ticket(ticket_id=ticket.id)
    entries = list(ContextEntry.objects.filter(endpoint__address="hist").order_by("seq"))
    assert [e.input for e in entries] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [e.seq for e in entries] == [1, 2, 3]


def test_research_waits_for_children_and_a_callback_turn_completes_it(make_endpoint):
    """The whole research flow in-process: the lock is released while
    waiting, and the parent's result is attributed to the exact callback turn
    that completed it; a later callback finds it done and changes nothing."""
    make_endpoint("demo.echo")
    make_endpoint("lab", path="runtime.demo.research")
    root = admit_ticket(endpoint="lab", input={"children": 2}).ticket
    runtime.run_ticket(ticket_id=root.id)
    root.refresh_from_db()
    assert root.state == "waiting"
    assert EndpointLock.objects.get(endpoint__address="lab").holder_id is None
    children = list(Ticket.objects.filter(parent=root).order_by("id"))
    assert len(children) == 2 and all(c.callback_state == "pending" for c in children)
    for child in children:
        runtime.run_ticket(ticket_id=child.id)
    callbacks = list(Ticket.objects.filter(callback_for__in=children).order_by("id"))
    assert len(callbacks) == 2
    for cb in callbacks:
        runtime.run_ticket(ticket_id=cb.id)
    root.refresh_from_db()
    assert root.state == "succeeded"
    assert [c["state"] for c in root.result["children"]] == ["succeeded", "succeeded"]
    # Both children were done when the first callback ran: it completed the
    # parent, and the second one's resume was ignored.
    first_turn = Turn.objects.get(ticket=callbacks[0])
    assert root.completed_by_turn_id == first_turn.id
    assert callbacks[1].events.filter(kind="resume_ignored").exists()
    assert all(Ticket.objects.get(id=c.id).callback_state == "recorded" for c in children)


def test_a_waiting_ticket_cannot_be_resumed_by_another_endpoint(make_endpoint):
    from runtime.runners import Outcome, Resume

    make_endpoint("demo.echo")
    make_endpoint("lab", path="runtime.demo.research")
    make_endpoint("intruder")
    root = admit_ticket(endpoint="lab", input={"children": 1}).ticket
    runtime.run_ticket(ticket_id=root.id)
    other = admit_ticket(endpoint="intruder", input={}).ticket
    started = runtime.start_turn(ticket_id=other.id)
    outcome = Outcome("success", result={}, resume=Resume(ticket=str(root.id), result="forged"))
    runtime.finish_turn(
        turn_id=started.turn.id, seq=started.turn.seq, outcome=outcome, source="test"
    )
    root.refresh_from_db()
    assert root.state == "waiting" and root.result is None
    assert other.events.filter(kind="resume_refused").exists()


def test_a_waiting_ticket_is_resumed_only_by_a_turn_that_answers_it(make_endpoint):
    """docs/explanation/design.md "Who completes a waiting ticket": a ticket of the same
    endpoint whose input looks like a callback, and a callback of another
    waiting ticket's child, cannot resume it; its own child's callback can."""
    from runtime.runners import Outcome, Resume

    make_endpoint("demo.echo")
    make_endpoint("echo.two")
    make_endpoint("lab", path="runtime.demo.research")
    root = admit_ticket(endpoint="lab", input={"children": 1}).ticket
    other = admit_ticket(endpoint="lab", input={"children": 1, "child_endpoint": "echo.two"})
    for ticket in (root, other.ticket):
        runtime.run_ticket(ticket_id=ticket.id)
    forged = {"callback": {"continuation": {"ticket": str(root.id)}}}
    look_alike = admit_ticket(endpoint="lab", input=forged).ticket
    [other_child] = Ticket.objects.filter(parent=other.ticket)
    runtime.run_ticket(ticket_id=other_child.id)
    others_callback = Ticket.objects.get(callback_for=other_child)

    def resume_root(ticket):
        started = runtime.start_turn(ticket_id=ticket.id)
        assert started is not None and started.ticket.id == ticket.id
        outcome = Outcome("success", result={}, resume=Resume(ticket=str(root.id), result="x"))
        runtime.finish_turn(
            turn_id=started.turn.id, seq=started.turn.seq, outcome=outcome, source="test"
        )

    for intruder in (look_alike, others_callback):
        resume_root(intruder)
        root.refresh_from_db()
        assert root.state == "waiting" and root.completed_by_turn_id is None
        refused = intruder.events.get(kind="resume_refused")
        assert refused.detail["why"] == "it answers no call of this ticket"
    [child] = Ticket.objects.filter(parent=root)
    runtime.run_ticket(ticket_id=child.id)
    runtime.run_ticket(ticket_id=Ticket.objects.get(callback_for=child).id)
    root.refresh_from_db()
    assert root.state == "succeeded"
