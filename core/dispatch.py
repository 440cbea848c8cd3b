"""Publishing work to the broker: by task name, after the transaction commits.

Services never import tasks (no import cycle between the runtime and
admission). A publish that fails after commit loses nothing: the ticket row is
the truth and beat's lost-dispatch sweep publishes it again.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.db import transaction

log = logging.getLogger(__name__)

RUN_TICKET = "runtime.run_ticket"
DELIVER = "tickets.deliver"
# The channel that wakes the dispatcher (runtime/dispatcher.py): admission
# notifies it in the statement that marks a ticket as owing a dispatch.
DISPATCH_CHANNEL = "claimcheck_dispatch"


def publish_now(task_name: str, ids: list[str]) -> int:
    """Send ``task_name(id)`` for each id at once (the caller is outside any
    transaction), over one producer connection. Returns how many were sent
    (the first ones); the caller decides what becomes of the rest
    (``runtime.turns.dispatch`` marks them owed again)."""
    app = current_app

    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for one in ids:
                app.send_task(task_name, args=[one], producer=producer)
                sent += 1
    except Exception:  # broker down: the caller marks them owed again (or the sweep)
        log.exception(
            "publish of %d %s message(s) failed; they stay owed", len(ids) - sent, task_name
        )
    return sent


def publish(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Send ``task_name(*args)`` once the current transaction commits."""

    def send() -> None:
        app = current_app

        try:
            app.send_task(task_name, args=list(args), countdown=countdown)
        except Exception:  # broker down: the sweeps re-publish from the ledger
            log.exception("publish of %s%r failed; the sweep will retry", task_name, args)

    transaction.on_commit(send)


def messages_in_flight(task_name: str, ids: set[str], *, workers: int) -> set[str] | None:
    """Of ``ids``, those that still have a ``task_name(id)`` message: waiting
    in its queue on the broker (every worker slot busy), or delivered to a
    worker that is alive and holds it reserved until a slot frees (prefetch).
    A message delivered to a worker that has since died stays unacknowledged
    in Redis until the visibility timeout (days): it counts as lost.

    ``workers``: how many live workers consume the task's queue (the
    registry's count): the question to them ends once that many answered.

    None when the broker cannot be read (not Redis, or unreachable): the
    caller has no evidence either way."""
    import base64
    import json

    app = current_app

    queue = app.amqp.router.route({}, task_name)["queue"].name
    found: set[str] = set()
    unacked: set[str] = set()

    def match(raw: bytes | str, into: set[str]) -> None:
        try:
            message = json.loads(raw)
            if isinstance(message, list):  # the unacked hash: [message, exchange, key]
                message = message[0]
            if message.get("headers", {}).get("task") != task_name:
                return
            args = json.loads(base64.b64decode(message["body"]))[0]
        except (ValueError, KeyError, IndexError, TypeError):
            return
        if args and str(args[0]) in ids:
            into.add(str(args[0]))

    try:
        with app.connection_for_read() as conn:
            if conn.transport.driver_type != "redis":
                return None
            channel = conn.default_channel
            client = channel.client
            for priority in channel.priority_steps:
                for raw in client.lrange(channel._q_for_pri(queue, priority), 0, -1):
                    match(raw, found)
            if ids - found:
                for raw in client.hvals(channel.unacked_key):
                    match(raw, unacked)
    except Exception:  # the broker is unreachable: no evidence
        log.warning("could not read the broker's %s queue", queue, exc_info=True)
        return None
    if unacked - found and workers > 0:
        found |= unacked & _reserved_by_live_workers(task_name, workers)
    return found


def _reserved_by_live_workers(task_name: str, workers: int, timeout: float = 1.0) -> set[str]:
    """The ids of ``task_name`` messages the workers that answer within
    ``timeout`` hold reserved (Celery's remote control, answered by each
    worker's main process even while every pool slot is busy)."""
    app = current_app

    try:
        replies = app.control.inspect(timeout=timeout, limit=workers).reserved() or {}
    except Exception:
        log.warning("could not ask the workers what they hold reserved", exc_info=True)
        return set()
    held = set()
    for requests in replies.values():
        for request in requests or ():
            if request.get("name") == task_name and request.get("args"):
                held.add(str(request["args"][0]))
    return held
