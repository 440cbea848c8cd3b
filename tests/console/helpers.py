"""Build console test data through the services, in-process (no worker)."""

from __future__ import annotations

from endpoints.services import create_endpoint
from recovery.models import RecoveryCase
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket


def echo_endpoint(address: str, **settings):
    return create_endpoint(
        address=address, runner={"kind": "python", "path": "runtime.demo.echo"}, **settings
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


def waiting_family(prefix: str, owner_username: str):
    """A ``demo.research`` root on ``<prefix>.research`` waiting on two
    children of ``<prefix>.child`` (a ``demo.stuck`` runner): the first
    child's turn is quarantined and an owner authorises its re-run (same
    input: the children sleep 0.05 s). Left for a worker (or
    ``run_queued``) to finish: the re-run and the second child, then their
    callbacks to the root, the last of which completes it. Built through
    the runtime's and recovery's own steps; returns (root, first, second,
    re-run)."""
    from console.owners import create_owner  # noqa: PLC0415
    from recovery.services import decide, inspect_case  # noqa: PLC0415

    create_endpoint(
        address=f"{prefix}.research", runner={"kind": "python", "path": "runtime.demo.research"}
    )
    create_endpoint(
        address=f"{prefix}.child",
        runner={"kind": "python", "path": "runtime.demo.stuck"},
        interrupt_grace_s=0.05,
    )
    owner = create_owner(
        username=owner_username,
        password=f"pw-{owner_username}-1",
        endpoints=[f"{prefix}.research", f"{prefix}.child"],
    )
    root = admit_ticket(
        endpoint=f"{prefix}.research",
        input={
            "children": 2,
            "child_endpoint": f"{prefix}.child",
            "child_input": {"seconds": 0.05},
        },
    ).ticket
    runtime.run_ticket(ticket_id=root.id)  # dispatches the children and waits
    first, second = Ticket.objects.filter(parent_id=root.id).order_by("id")
    started = runtime.start_turn(ticket_id=first.id)
    assert started is not None and started.ticket.id == first.id
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id),
        timeout=10,
        message="the interrupt grace to pass",
    )
    inspection = inspect_case(case_id=case_id, user=owner)
    decision = decide(
        case_id=case_id,
        user=owner,
        action="authorize_rerun",
        inspection_id=inspection.id,
        rationale="the child hung; run it again",
    )
    return root, first, second, decision.rerun_ticket


def run_queued(*addresses: str) -> None:
    """Run every queued ticket of the endpoints, oldest first, in-process,
    until none is left (a turn may queue more: callbacks)."""
    while (
        ticket := Ticket.objects.filter(endpoint__address__in=addresses, state="queued")
        .order_by("id")
        .first()
    ) is not None:
        runtime.run_ticket(ticket_id=ticket.id)
