"""The runtime's services besides a turn's own path (``runtime/turns/``):
an owner's pause and
resume of an endpoint (no turn starts while paused; the running one
drains), and staff stopping or resuming a worker's consuming. A ticket's
cancel is the ledger's (``cancel_ticket``, tickets/turns/interrupt.py),
named here for the runtime's callers."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from core.dispatch import DISPATCH_CHANNEL
from core.errors import Forbidden, Invalid, NotFound
from core.wakes import wake
from endpoints.models import Endpoint
from endpoints.selectors import is_owner, resolve_endpoint
from endpoints.services import record_event, required_reason
from tickets.models import EndpointLock
from tickets.turns.interrupt import cancel_ticket as cancel_ticket  # the ledger's

from . import registry
from .models import Worker, WorkerEvent


def _owned_for_pause(address: str, user, what: str) -> Endpoint:
    endpoint = resolve_endpoint(address)
    if not is_owner(user, endpoint):
        raise Forbidden(f"only the endpoint's owners may {what} it")
    return endpoint


def pause_endpoint(*, address: str, user, reason: Any) -> tuple[Endpoint, bool]:
    """Pause an endpoint (its owners and staff): from the commit on, admission
    queues new tickets (``enqueue``) or refuses them with ``endpoint_paused``
    (``reject``), and no turn starts; a turn running now finishes. One
    conditional UPDATE of the endpoint row, which every start updates too,
    so a start and a pause are ordered by that row: a start that committed
    first runs its turn, one that comes after sees the pause and starts
    nothing. Answers the endpoint and whether this call paused it: pausing a
    paused endpoint changes nothing and records nothing (a retried request
    is safe), and the endpoint still shows the first pause's actor and
    reason. A pause leaves the state alone: a quarantine holds beside it."""
    reason = required_reason(reason, "pause")
    endpoint = _owned_for_pause(address, user, "pause")
    actor = f"user:{user.username}"
    with transaction.atomic():
        now = timezone.now()
        paused = Endpoint.objects.filter(id=endpoint.id, paused_at__isnull=True).update(
            paused_at=now, pause_actor=actor, pause_reason=reason, updated_at=now
        )
        endpoint = Endpoint.objects.get(id=endpoint.id)
        if paused:
            lock = EndpointLock.objects.filter(endpoint_id=endpoint.id).first()
            record_event(
                endpoint,
                "paused",
                actor,
                {
                    "reason": reason,
                    "state": endpoint.state,
                    # The turn that may still finish (drain) after the pause.
                    "running_turn": str(lock.holder_id) if lock and lock.holder_id else None,
                },
            )
    return endpoint, bool(paused)


def resume_endpoint(*, address: str, user, reason: Any) -> tuple[Endpoint, bool]:
    """Resume a paused endpoint (its owners and staff): one conditional UPDATE
    clears the pause (never the state: a quarantine stays until its owner
    decides), an EndpointEvent records who and why, and the dispatcher is
    woken at commit: the tickets that queued meanwhile kept their marks, so
    its next pass publishes the oldest. Resuming an endpoint that is not
    paused changes nothing and records nothing."""
    reason = required_reason(reason, "resume")
    endpoint = _owned_for_pause(address, user, "resume")
    actor = f"user:{user.username}"
    with transaction.atomic():
        now = timezone.now()
        # The row locked: the pause it clears is the one the event records.
        before = (
            Endpoint.objects.select_for_update()
            .filter(id=endpoint.id)
            .values("paused_at", "pause_actor")
            .first()
        )
        resumed = Endpoint.objects.filter(id=endpoint.id, paused_at__isnull=False).update(
            paused_at=None, pause_actor="", pause_reason="", updated_at=now
        )
        endpoint = Endpoint.objects.get(id=endpoint.id)
        if resumed:
            record_event(
                endpoint,
                "resumed",
                actor,
                {
                    "reason": reason,
                    "state": endpoint.state,
                    "paused_at": before["paused_at"].isoformat() if before["paused_at"] else None,
                    "paused_by": before["pause_actor"],
                },
            )
            wake(DISPATCH_CHANNEL)  # after commit: core/wakes.py
    return endpoint, bool(resumed)


CONSUME_REPLY_TIMEOUT_S = 2.0


def set_worker_consuming(
    *, worker: str, queue: str, consume: bool, user, reason: Any
) -> tuple[Worker, bool]:
    """Staff stop (``consume=False``) or resume a worker's consuming of one of
    its queues with Celery's remote control (``cancel_consumer`` /
    ``add_consumer``, sent to that worker only and answered by its main
    process, whatever its pool is doing). The turns it runs go on and
    finish; it takes no new message from the queue until it is told to
    consume again or restarts. The command is sent first, outside any
    transaction; then a ``consumer_cancelled`` / ``consumer_added``
    WorkerEvent records who, why and whether the worker answered, and an
    answered command updates the registry's ``consuming`` at once (the
    worker's next heartbeat reports what it really consumes). Answers the
    worker and whether it answered."""
    if not getattr(user, "is_staff", False):
        raise Forbidden("only staff may stop or resume a worker's consuming")
    reason = required_reason(reason, "stop or resume of consuming")
    row = Worker.objects.filter(name=worker).first()
    if row is None:
        raise NotFound(f"worker {worker!r} not found")
    if queue not in row.queues:
        raise Invalid(f"worker {worker} was started for {', '.join(row.queues)}, not {queue!r}")
    replies = registry.send_consumer_command(
        worker, queue=queue, consume=consume, timeout=CONSUME_REPLY_TIMEOUT_S
    )
    answered = bool(replies) and all("ok" in r for r in replies)
    with transaction.atomic():
        if answered:
            # One row: a conditional UPDATE from the row's current list is not
            # needed, the heartbeat rewrites it from the worker's own consumer.
            row = Worker.objects.select_for_update().get(id=row.id)
            consuming = [q for q in row.consuming if q != queue]
            if consume:
                consuming = sorted({*consuming, queue})
            row.consuming = consuming
            row.save(update_fields=["consuming"])
        WorkerEvent.objects.create(
            worker=worker,
            kind="consumer_added" if consume else "consumer_cancelled",
            actor=f"user:{user.username}",
            detail={"queue": queue, "reason": reason, "answered": answered, "replies": replies},
            at=timezone.now(),
        )
    return row, answered
