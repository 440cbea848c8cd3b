"""Turn events written while a turn runs: an agent's tool receipts
(``tool_started`` / ``tool_ended``) and its usage (``agent_usage``).

They are evidence, not transitions: the supervisor writes each one as the
isolated process reports it, in its own short transaction, so a worker that
dies mid-tool-call leaves a ``tool_started`` with no end. A recovery case's
inspection snapshot carries them with the ticket's other events.
"""

from __future__ import annotations

import logging
from typing import Any

from core.canonical import canonical_json
from tickets import lifecycle

from ..models import Turn

log = logging.getLogger(__name__)

# The kinds a turn's process may write, and the largest detail it may give
# one (bigger arguments and results go to artifacts first: the event keeps
# a pointer and a digest).
TURN_EVENT_KINDS = ("tool_started", "tool_ended", "agent_usage")
TURN_EVENT_MAX_BYTES = 4096


def record_turn_event(*, turn: Turn, event: dict[str, Any]) -> bool:
    """Append one turn event of an allowed kind to the turn's ticket; a
    detail over ``TURN_EVENT_MAX_BYTES`` is refused (logged, not written)."""
    kind = event.get("kind")
    if kind not in TURN_EVENT_KINDS:
        log.warning("turn %s: event kind %r refused", turn.id, kind)
        return False
    detail = {k: v for k, v in event.items() if k != "kind"}
    if len(canonical_json(detail, default=str)) > TURN_EVENT_MAX_BYTES:
        log.warning("turn %s: %s event over %s bytes refused", turn.id, kind, TURN_EVENT_MAX_BYTES)
        return False
    lifecycle.append_event(
        ticket_id=turn.ticket_id,
        kind=kind,
        actor=f"turn:{turn.seq}:worker",
        turn_id=turn.id,
        detail=detail,
    )
    return True
