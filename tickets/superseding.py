"""The ``interrupt`` busy policy's request, which the runtime carries out.

A ticket admitted to an ``interrupt`` endpoint while a turn runs there
supersedes that turn: once the admission commits, the turn is asked to stop
through the runtime's normal budget path (``runtime.turns.request_interrupt``:
the cooperative flag, the grace, the escalation, and quarantine when the
stop is unproven). ``tickets`` sits below ``runtime`` (docs/explanation/design.md,
"Layers"), so the runtime registers that request here at start-up
(``RuntimeConfig.ready``) rather than being imported."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

log = logging.getLogger(__name__)

# (turn id, its seq, the superseding ticket's id) -> whether it was asked.
Supersede = Callable[[uuid.UUID, int, uuid.UUID], bool]

_handler: Supersede | None = None


def register(handler: Supersede) -> None:
    global _handler
    _handler = handler


def supersede(turn_id: uuid.UUID, seq: int, by: uuid.UUID) -> None:
    """Ask turn ``turn_id`` (only while it runs with ``seq``) to stop for
    ticket ``by``; after the admission's commit. A failure is logged, never
    raised: the ticket is admitted and queues whatever the request does."""
    if _handler is None:
        log.error("no supersede handler registered: turn %s keeps running for %s", turn_id, by)
        return
    try:
        _handler(turn_id, seq, by)
    except Exception:  # the admission stands; the running turn finishes
        log.exception("ticket %s could not ask turn %s to stop", by, turn_id)
