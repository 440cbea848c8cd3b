"""Late or foreign outcomes and heartbeats: recorded as evidence, never
applied."""

from __future__ import annotations

import logging
from typing import Any

from tickets import lifecycle
from tickets.models import Turn

from ..ports import case_keeper

log = logging.getLogger(__name__)


def record_stale(*, turn: Turn, seq: int, kind: str, source: str, detail: dict[str, Any]) -> None:
    """A late or foreign outcome: an event on the ticket, and evidence filed by
    the case keeper (on the open case when the turn is the uncertain one).
    Nothing else."""
    lifecycle.append_event(
        ticket_id=turn.ticket_id,
        kind="stale_outcome",
        actor=f"{source}",
        turn_id=turn.id,
        detail={"seq": seq, "turn_state": turn.state, "outcome": kind, **detail},
    )
    case_keeper().record_late_evidence(turn=turn, kind=kind, seq=seq, source=source, detail=detail)
