"""A turn whose own process dies (SIGKILL of the isolated child, the
worker alive) while a side-effecting tool call has no end reaches an owner
as an uncertain turn does: a case, the endpoint quarantined, the open call
in the inspection, retry refused naming the case; the re-run the owner
authorises shows its tool the idempotency key in doubt. With no
side-effecting call open a died process stays ``failed: runner_died``; a
process that raises before it can report says why. Real PostgreSQL, Redis
and Celery workers; an offline model."""

from __future__ import annotations

import json
import os
import signal

import pytest

from recovery.audit import audit_ledger
from recovery.models import RecoveryCase
from recovery.services import decide, inspect_case
from runtime.selectors import slot_holding
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketEvent, Turn

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DOUBT = {"kind": "agent", "framework": "pydantic_ai", "path": "tests.agents.doubt_agent.build"}
DEMO = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}
TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")


def state_of(ticket_id) -> str:
    return Ticket.objects.values_list("state", flat=True).get(id=ticket_id)


def settled(ticket_id, timeout: float = 30) -> Ticket:
    wait_for(lambda: state_of(ticket_id) in TERMINAL, timeout=timeout, message="the ticket to end")
    return Ticket.objects.get(id=ticket_id)


def test_a_turn_process_killed_mid_side_effect_opens_a_case_and_its_rerun_sees_the_key(
    celery_procs, make_endpoint, staff_user, api, tmp_path
):
    celery_procs.env["AGENT_PRELOAD"] = "pydantic_ai"
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint("plain.agent", runner=DEMO)
    make_endpoint("doubt.agent", runner=DOUBT, owners=[staff_user.username])

    # No side-effecting call open: the died process is a plain failure.
    slow = admit_ticket(endpoint="plain.agent", input={"prompt": "slow 60"}).ticket
    wait_for(
        lambda: TicketEvent.objects.filter(ticket=slow, kind="tool_started").exists(),
        message="the slow call to start",
    )
    child = slot_holding(Turn.objects.get(ticket=slow).id).child_pid
    os.kill(child, signal.SIGKILL)
    slow = settled(slow.id)
    assert slow.state == "failed" and slow.error["code"] == "runner_died", slow.error
    assert not RecoveryCase.objects.filter(ticket=slow).exists()

    # The side-effecting call in flight when only the turn's process dies.
    ticket = admit_ticket(endpoint="doubt.agent", input={"prompt": f"charge {tmp_path}"}).ticket
    [record] = wait_for(lambda: list(tmp_path.glob("*.json")), message="the charge to start")
    first = json.loads(record.read_text())
    assert first["in_doubt"] is None
    os.kill(first["pid"], signal.SIGKILL)
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=ticket).first(),
        timeout=20,
        message="a case for the side effect in doubt",
    )
    assert case.endpoint.state == "quarantined"
    assert state_of(ticket.id) == "recovering"
    turn = Turn.objects.get(ticket=ticket)
    assert turn.state == "uncertain"
    assert first["key"] in case.reason and "charge" in case.reason
    assert celery_procs.alive("turns")  # only the turn's process died

    # Nobody re-runs it behind the owner's back: retry names the case.
    refused = api.post(f"/tickets/{ticket.id}/retry", {"reason": "try again"})
    assert refused.status_code == 409, refused.content
    assert refused.json()["case"] == str(case.id)
    assert str(case.id) in refused.json()["detail"]

    inspection = inspect_case(case_id=case.id, user=staff_user)
    [call] = inspection.snapshot["tool_calls"]
    assert call["tool"] == "charge" and call["side_effect"] is True
    assert call["ended_at"] is None and call["idempotency_key"] == first["key"]

    decision = decide(
        case_id=case.id,
        user=staff_user,
        action="authorize_rerun",
        inspection_id=inspection.id,
        rationale="the downstream system deduplicates on the key in doubt",
    )
    rerun = settled(decision.rerun_ticket_id)
    assert rerun.state == "succeeded", rerun.error
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    [again] = [s for s in seen if s["key"] != first["key"]]
    # The tool sees both keys: its own new one and the one in doubt.
    assert again["in_doubt"] == first["key"]
    started = TicketEvent.objects.get(ticket_id=rerun.id, kind="tool_started")
    assert started.detail["idempotency_key"] == again["key"]
    assert started.detail["idempotency_key_in_doubt"] == first["key"]
    # The ledger's own audit agrees with the whole flow.
    report = audit_ledger()
    assert report.ok, report.as_dict()


def test_a_turn_process_that_raises_before_it_reports_says_why(celery_procs, make_endpoint):
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint("broken.agent", runner={**DOUBT, "path": "tests.agents.doubt_agent.broken"})
    ticket = admit_ticket(endpoint="broken.agent", input={"prompt": "hello"}).ticket
    ticket = settled(ticket.id)
    assert ticket.state == "failed", ticket.error
    text = json.dumps(ticket.error)
    assert "NameError" in text and "undefined_name" in text, ticket.error
    assert "Traceback" in ticket.error.get("traceback", ""), ticket.error
    assert "doubt_agent.py" in ticket.error["traceback"]
    assert len(ticket.error["traceback"]) <= 4000
    log = celery_procs.log("turns").decode(errors="replace")
    assert "NameError: name 'undefined_name' is not defined" in log
    assert "Traceback" in log
