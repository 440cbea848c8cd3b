"""Build console test data through the services, in-process (no worker)."""

from __future__ import annotations

from endpoints import runtime
from endpoints.services import create_endpoint
from recovery.models import RecoveryCase
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket


def echo_endpoint(address: str, **settings):
    return create_endpoint(
        address=address, runner={"kind": "python", "path": "endpoints.demo.echo"}, **settings
    )


def quarantined_case(address: str) -> RecoveryCase:
    """An endpoint whose turn overran and gave no stop evidence: the turn is
    uncertain, the endpoint quarantined, a recovery case open."""
    echo_endpoint(address, interrupt_grace_s=0.05)
    ticket = admit_ticket(endpoint=address, input={"task": "stuck"}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    # The grace period has to pass before quarantine is allowed.
    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id),
        timeout=5,
        message="the interrupt grace to pass",
    )
    return RecoveryCase.objects.select_related("endpoint", "turn", "ticket").get(id=case_id)


def finished_gated_ticket(address: str, submitter=None):
    """A root ticket run to success on an endpoint that requires approval:
    its pull delivery waits for an owner (``awaiting_approval``)."""
    echo_endpoint(address, requires_approval=True)
    ticket = admit_ticket(endpoint=address, input={"q": "approve me"}, submitter=submitter).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    return Ticket.objects.select_related("endpoint").get(id=ticket.id)
