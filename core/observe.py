"""The hooks the services call so that metrics and log context follow the
work: one call per chokepoint, no logic of the services here.

- ``transition``: every ticket state change, from a turn's start
  (``tickets/turns/start.py``) and every later move
  (``tickets/terminal.after_move``). Counts it once its transaction
  commits (turns started and ended, queue wait, turn duration) and, for
  ``turn_started`` in a worker, binds the turn's ids for the rest of the
  task's log lines.
- ``admission``: wraps ``tickets/admission.admit_ticket``: admitted,
  duplicate or refused (by error code); records the ticket's trace for the
  response's ``traceparent``.
- ``delivery_attempt``: one webhook attempt's status (tickets/tasks.deliver).
- ``sweep``/``swept``: each sweep's wall time and what it did.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from core import logs, metrics, tracing

log = logging.getLogger("claimcheck.observe")


def _uuid7_age_s(value: uuid.UUID | str | None) -> float | None:
    """Seconds since a UUIDv7 was made (its first 48 bits are Unix ms): ticket
    and turn ids are UUIDv7 (core/ids.py), so their ages need no query."""
    if value is None:
        return None
    if not isinstance(value, uuid.UUID):
        value = uuid.UUID(str(value))
    if value.version != 7:
        return None
    return max(0.0, time.time() - (value.int >> 80) / 1000)


def transition(
    *,
    ticket_id: uuid.UUID,
    expected: str,
    to: str,
    kind: str,
    turn_id: uuid.UUID | None,
    fields: dict[str, Any],
) -> None:
    expected, to = str(expected), str(to)
    if kind == "turn_started":
        turn = fields.get("turn")
        if turn is not None and logs.current().get("task"):
            logs.bind(
                ticket_id=ticket_id,
                turn_id=turn.id,
                seq=turn.seq,
                endpoint=turn.endpoint.address,
                trace_id=turn.ticket.trace_id,
            )
    # Measured now (the moment of the change), counted at commit (a rolled
    # back transition did not happen).
    wait = _uuid7_age_s(ticket_id) if kind == "turn_started" else None
    ran = _uuid7_age_s(turn_id) if expected == "running" and turn_id is not None else None

    def count() -> None:
        metrics.TRANSITIONS.labels(expected, to).inc()
        if kind == "turn_started":
            metrics.TURNS_STARTED.inc()
            if wait is not None:
                metrics.QUEUE_WAIT.observe(wait)
        if expected == "running":
            metrics.TURNS.labels(to).inc()
            if ran is not None:
                metrics.TURN_DURATION.labels(to).observe(ran)

    transaction.on_commit(count)


def admission(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for ``admit_ticket``."""
    from core.errors import DomainError  # noqa: PLC0415
    from core.transient import TRANSIENT_ERRORS  # noqa: PLC0415

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            admitted = func(*args, **kwargs)
        except DomainError as exc:
            metrics.ADMISSIONS.labels("refused", exc.code).inc()
            raise
        except TRANSIENT_ERRORS:
            metrics.ADMISSIONS.labels("refused", "unavailable").inc()
            raise
        ticket = admitted.ticket
        metrics.ADMISSIONS.labels("duplicate" if admitted.duplicate else "admitted", "").inc()
        tracing.answer_with(ticket.trace_id)
        # DEBUG: one line per admission is the access log's job; this one ties
        # the request id to the ticket id when an operator asks for it.
        log.debug(
            "ticket %s %s",
            ticket.id,
            "duplicate returned" if admitted.duplicate else "admitted",
            extra={"ticket_id": str(ticket.id), "trace_id": ticket.trace_id},
        )
        return admitted

    return wrapper


def delivery_attempt(sent: Any) -> Any:
    """Count one attempt (``tickets.delivery.Sent``; None: nothing was sent)."""
    if sent is None:
        return sent
    if sent.refused:
        status = "refused"
    elif sent.status_code is None:
        status = "error"
    else:
        status = f"{sent.status_code // 100}xx"
    metrics.DELIVERY_ATTEMPTS.labels(status).inc()
    return sent


@contextmanager
def sweep(name: str) -> Iterator[None]:
    """Time one sweep run (health/services.sweep_run)."""
    started = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        metrics.SWEEP_DURATION.labels(name).observe(time.monotonic() - started)
        if not ok:
            metrics.SWEEP_RUNS.labels(name, "skipped").inc()


def _actions(name: str, result: Any) -> dict[str, int]:
    """What a sweep's return value says it did, as counts."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return {k: int(v) for k, v in result.items()}
    if hasattr(result, "interrupted"):  # runtime.turns.SweepReport
        return {
            "interrupted": len(result.interrupted),
            "quarantined": len(result.quarantined),
            # Not quarantined yet: a live worker holds the turn's outcome.
            "held": len(getattr(result, "held", ())),
        }
    if isinstance(result, int):
        return {"done": result}
    return {
        {"lost_dispatches": "redispatched", "deliveries": "published"}.get(name, "done"): len(
            result
        )
    }


def swept(name: str, result: Any) -> Any:
    """Record what the sweep ``name`` did; INFO when it did something, DEBUG
    when it did nothing (a quiet system has a quiet log)."""
    done = _actions(name, result)
    if getattr(result, "skipped", False):
        metrics.SWEEP_RUNS.labels(name, "skipped").inc()
        log.debug("sweep %s skipped: another sweeper holds its lock", name)
        return result
    acted = {k: v for k, v in done.items() if v}
    for action, count in acted.items():
        metrics.SWEEP_ACTIONS.labels(name, action).inc(count)
    metrics.SWEEP_RUNS.labels(name, "acted" if acted else "idle").inc()
    if acted:
        log.info("sweep %s: %s", name, ", ".join(f"{k} {v}" for k, v in sorted(acted.items())))
    else:
        log.debug("sweep %s: nothing to do", name)
    return result
