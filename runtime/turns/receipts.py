"""Turn events written while a turn runs: an agent's tool receipts
(``tool_started`` / ``tool_ended``) and its usage (``agent_usage``).

They are evidence, not transitions: the supervisor writes each one as the
isolated process reports it, in its own short transaction, so a worker that
dies mid-tool-call leaves a ``tool_started`` with no end. A recovery case's
inspection snapshot carries them with the ticket's other events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

from core.canonical import canonical_json
from tickets import budgets, lifecycle
from tickets.models import Ticket, TicketEvent, Turn

log = logging.getLogger(__name__)

# The kinds a turn's process may write, and the largest detail it may give
# one (bigger arguments and results go to artifacts first: the event keeps
# a pointer and a digest).
TURN_EVENT_KINDS = ("tool_started", "tool_ended", "agent_usage")
TURN_EVENT_MAX_BYTES = 4096


def record_turn_event(
    *,
    turn: Turn,
    event: dict[str, Any],
    exhausted: Callable[[str], Any] | None = None,
) -> bool:
    """Append one turn event of an allowed kind to the turn's ticket; a
    detail over ``TURN_EVENT_MAX_BYTES`` is refused (logged, not written).
    An ``agent_usage`` counts against its trace's budget in the same
    transaction (tickets/budgets.py); when it is the one that exhausts the
    budget, ``exhausted(trace_id)`` is called after the commit (the
    caller's interrupt of the trace's running turns)."""
    kind = event.get("kind")
    if kind not in TURN_EVENT_KINDS:
        log.warning("turn %s: event kind %r refused", turn.id, kind)
        return False
    detail = {k: v for k, v in event.items() if k != "kind"}
    if len(canonical_json(detail, default=str)) > TURN_EVENT_MAX_BYTES:
        log.warning("turn %s: %s event over %s bytes refused", turn.id, kind, TURN_EVENT_MAX_BYTES)
        return False
    with transaction.atomic():
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind=kind,
            actor=f"turn:{turn.seq}:worker",
            turn_id=turn.id,
            detail=detail,
        )
        if kind == "agent_usage":
            trace_id = Ticket.objects.filter(id=turn.ticket_id).values_list("trace_id", flat=True)
            charged = budgets.charge(
                trace_id=trace_id.get(), ticket_id=turn.ticket_id, turn_id=turn.id, usage=detail
            )
            if charged is not None and charged.exhausted and exhausted is not None:
                transaction.on_commit(lambda: exhausted(charged.trace_id))
    return True


# The open calls a case records (a turn with more in flight at once is
# recorded with the first of them and the count).
MAX_OPEN_CALLS = 50


def open_side_effect_calls(*, ticket_id: Any, turn_id: Any, runner: dict[str, Any]) -> list[dict]:
    """The side-effecting tool calls of one turn whose ``tool_started`` has
    no ``tool_ended``: the receipt says ``side_effect``, or the runner names
    the tool in ``side_effect_tools``. Each as ``{call_id, tool,
    args_sha256, idempotency_key}``, oldest first."""
    named = set(runner.get("side_effect_tools") or ())
    started: dict[str, dict[str, Any]] = {}
    rows = TicketEvent.objects.filter(
        ticket_id=ticket_id, turn_id=turn_id, kind__in=("tool_started", "tool_ended")
    ).order_by("id")
    for kind, detail in rows.values_list("kind", "detail"):
        call_id = str(detail.get("call_id"))
        if kind == "tool_started":
            started[call_id] = detail
        else:
            started.pop(call_id, None)
    return [
        {
            "call_id": call_id,
            "tool": d.get("tool"),
            "args_sha256": d.get("args_sha256"),
            "idempotency_key": d.get("idempotency_key"),
        }
        for call_id, d in started.items()
        if d.get("side_effect") or d.get("tool") in named
    ]


def keys_in_doubt(*, ticket: Ticket, runner: dict[str, Any]) -> list[dict[str, Any]]:
    """For a re-run an owner authorised (``rerun_of``) or a retry
    (``retry_of``): the side-effecting calls of the original ticket's turns
    that never recorded an end, with the idempotency key each ran under, so
    the new turn's tools can tell the system they change that this call may
    be a repeat. Empty for any other ticket (no query)."""
    original = ticket.rerun_of_id or ticket.retry_of_id
    if original is None:
        return []
    turns = Turn.objects.filter(ticket_id=original).order_by("seq").values_list("id", flat=True)
    calls: list[dict[str, Any]] = []
    for turn_id in turns:
        for call in open_side_effect_calls(ticket_id=original, turn_id=turn_id, runner=runner):
            calls.append({**call, "ticket": str(original), "turn": str(turn_id)})
    return calls[:MAX_OPEN_CALLS]
