"""The one-message-per-turn dispatch protocol: ``needs_dispatch``, the
release of the lock and the next ticket's message, the lost-dispatch sweep."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import psycopg
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.dispatch import (
    DISPATCH_CHANNEL,
    RUN_TICKET,
    messages_in_flight,
    publish,
    publish_now,
)
from core.sqlfunctions import call_cursor
from core.transient import TRANSIENT_DB_ERRORS
from core.wakes import wake
from tickets.models import EndpointLock, Ticket, TicketState, Turn
from tickets.rules import EndpointMayStart
from tickets.turns import lock as lock_calls

from ..models import Worker
from .sweeplock import sweep_lock

log = logging.getLogger(__name__)


def redispatch_if_free(lock: EndpointLock) -> None:
    """The attempt that committed a finish lost its after-commit publish of the
    endpoint's next ticket along with its reply. Publish the oldest queued
    ticket again if the endpoint is free (the caller holds the lock row); a
    duplicate message is a no-op, and the lost-dispatch sweep is the backstop."""
    if lock.holder_id is not None or lock.endpoint.paused_at is not None:
        return
    oldest = (
        Ticket.objects.filter(endpoint_id=lock.endpoint_id, state=TicketState.QUEUED)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if oldest is not None:
        publish(RUN_TICKET, str(oldest))


def release_lock(*, endpoint_id: int, turn: Turn) -> None:
    """Release the lock held by ``turn`` (the caller holds the lock row) and,
    after commit, dispatch the endpoint's oldest queued ticket."""
    # The ledger's release (tickets/turns/lock.py), which the turn's finish
    # runs too: the release is written in one place.
    waiting = lock_calls.release_lock(endpoint_id=endpoint_id, turn_id=turn.id)
    if waiting is not None:
        publish_next(waiting)
    else:
        wake(DISPATCH_CHANNEL)  # claimcheck_next_ticket: none marked


def publish_next(ticket_id: uuid.UUID) -> None:
    """Publish the endpoint's next ticket (just unmarked) once the current
    transaction commits; if the broker refuses it, mark it again, so the
    dispatcher publishes it once the broker is back (``dispatch_owed``
    leaves an endpoint alone while its oldest ticket is unmarked)."""

    def send() -> None:
        if not publish_now(RUN_TICKET, [str(ticket_id)]):
            mark_again([ticket_id])

    transaction.on_commit(send)


def dispatch_next(*, endpoint_id: int) -> None:
    """After a release (the caller holds the lock row): publish, after commit,
    the oldest queued ticket that has no message in flight. Every queued
    ticket either has one in flight or is marked, so nothing is left behind,
    and each turn costs one broker message. The lost-dispatch sweep stays the
    backstop for a message the broker loses.

    Nothing marked: an admission committing now may have been invisible to
    this query, and the dispatcher it woke may have seen the lock still held,
    so wake the dispatcher again once the release commits."""
    # The ledger's next ticket (tickets/turns/lock.py), the step the release
    # ends with: written in one place.
    waiting = lock_calls.next_ticket(endpoint_id=endpoint_id)
    if waiting is not None:
        publish_next(waiting)
    else:
        wake(DISPATCH_CHANNEL)


# What the dispatcher owes, in one statement. An endpoint is owed a message
# when its lock is free, it is available and not paused (a paused endpoint's
# marks wait for the resume, whose commit wakes this pass: no pass spins on
# them), and its *oldest* queued ticket is
# marked: a start always takes the oldest queued ticket (FIFO), so an oldest
# ticket without the mark has its message in flight, and that message will
# start it (publishing another only makes a message that bounces: the race
# between a finish's publish and this pass would send extra messages under
# load).
#
# - waiting: the endpoints with a queued ticket, one probe of
#   ticket_queued_idx each (a loose index scan): O(endpoints with a queue),
#   not O(backlog).
# - free: their lock rows, free and available and oldest ticket marked,
#   locked in endpoint order (FOR UPDATE waits out a start or a release in
#   flight, then re-checks the row: a lock taken meanwhile drops out).
# - pick: that oldest ticket again, locked (skipping one a cancel holds) and
#   still marked; unmarked only if still marked and queued.
_OWED_SQL = """
WITH RECURSIVE waiting AS (
    (SELECT t.endpoint_id FROM tickets_ticket t WHERE t.state = 'queued'
     ORDER BY t.endpoint_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.endpoint_id FROM tickets_ticket t
            WHERE t.state = 'queued' AND t.endpoint_id > w.endpoint_id
            ORDER BY t.endpoint_id LIMIT 1)
    FROM waiting w WHERE w.endpoint_id IS NOT NULL
),
free AS (
    SELECT l.endpoint_id FROM runtime_endpointlock l
    JOIN endpoints_endpoint e ON e.id = l.endpoint_id
    WHERE l.endpoint_id IN (SELECT endpoint_id FROM waiting WHERE endpoint_id IS NOT NULL)
      AND l.holder_id IS NULL
      AND claimcheck_endpoint_may_start(p_state => e.state, p_paused_at => e.paused_at)
      AND (SELECT t.needs_dispatch FROM tickets_ticket t
           WHERE t.endpoint_id = l.endpoint_id AND t.state = 'queued'
           ORDER BY t.endpoint_id, t.id LIMIT 1)
    ORDER BY l.endpoint_id
    LIMIT %(limit)s
    FOR UPDATE OF l
),
pick AS (
    SELECT p.id FROM free CROSS JOIN LATERAL (
        SELECT t.id, t.needs_dispatch FROM tickets_ticket t
        WHERE t.endpoint_id = free.endpoint_id AND t.state = 'queued'
        ORDER BY t.endpoint_id, t.id LIMIT 1
        FOR UPDATE OF t SKIP LOCKED) p
    WHERE p.needs_dispatch
)
UPDATE tickets_ticket t SET needs_dispatch = false
WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.state = 'queued' AND t.needs_dispatch
RETURNING t.id
"""


def dispatch_owed(*, limit: int | None = None, session=None) -> list[uuid.UUID]:
    """The dispatcher's pass: unmark, in one statement, the oldest queued
    ticket of every free endpoint where that ticket is marked, then publish
    them in one batch (after the commit: no I/O under a lock). A publish that
    fails marks its tickets again, so the next pass retries them; a crash
    between the two leaves a queued ticket with neither mark nor message: the
    lost-dispatch sweep publishes it.

    ``session``: the dispatcher's own connection (psycopg, autocommit), the
    one that LISTENs, where the statement is prepared once when that session
    is known to be the server's for its whole life: ``DATABASE_LISTEN_URL``
    set (direct or session-pooled, whatever pools Django's connection), or
    ``DATABASE_PREPARED_CALLS`` (Django's connection keeps its session, and
    so does this one, made from the same URL). Otherwise it may go through a
    transaction pooler (a misconfiguration where no notification arrives,
    but where the poll still dispatches) and is not prepared. Prepared, a
    pass skips its planning, most of its cost, and a busy pipeline makes a
    pass for most admissions. Without a session, Django's connection (prepared
    with ``DATABASE_PREPARED_CALLS``)."""
    limit = limit or settings.DISPATCHER_BATCH
    params = {"limit": limit}
    if session is not None:  # one statement: atomic in autocommit
        prepare = bool(settings.DATABASE_LISTEN_URL) or settings.DATABASE_PREPARED_CALLS
        # A cursor binding on the server: the connection's own factory may be
        # Django's client-side one, which prepares nothing.
        with psycopg.Cursor(session) as cur:
            ids = [row[0] for row in cur.execute(_OWED_SQL, params, prepare=prepare).fetchall()]
    else:
        with call_cursor() as cur:
            cur.execute(_OWED_SQL, params)
            ids = [row[0] for row in cur.fetchall()]
    if ids:
        sent = publish_now(RUN_TICKET, [str(i) for i in ids])
        if sent < len(ids):
            mark_again(ids[sent:])
    return ids


def mark_again(ids: list[uuid.UUID]) -> None:
    """Their messages were not sent (the broker is down): mark them as owing
    a dispatch again, so a later pass publishes them and, meanwhile, no pass
    takes them for tickets with a message in flight. If the database is
    unreachable too, the lost-dispatch sweep is left."""
    try:
        Ticket.objects.filter(id__in=ids, state=TicketState.QUEUED).update(needs_dispatch=True)
    except TRANSIENT_DB_ERRORS:
        log.exception("could not mark %d unsent ticket(s) again; the sweep will", len(ids))


def sweep_lost_dispatches() -> list[uuid.UUID]:
    """Re-publish the oldest queued ticket of each free, available, unpaused
    endpoint whose message is really gone (the broker lost it, the publish failed
    after commit, the worker that held it died).

    1. Under the sweep's advisory lock, the candidates: each free, available
       endpoint's oldest queued ticket, unchanged for ``REDISPATCH_AFTER_S``
       (a paused endpoint's tickets wait by design, their marks kept).
    2. The evidence, from the broker (outside any transaction): a candidate
       whose message still waits in the queue, or is held reserved by a live
       worker, only waits for a free slot. It is left alone: another message
       would only pile up behind it and bounce.
    3. The rest are published again (a duplicate would be harmless: the
       ticket row decides). When the broker cannot be read there is no
       evidence either way, and the age alone decides, as it must for a
       message lost with a broker that is down."""
    cutoff = timezone.now() - timedelta(seconds=settings.REDISPATCH_AFTER_S)
    candidates: list[uuid.UUID] = []
    with sweep_lock("dispatch") as mine:
        if not mine:
            return []
        free = (
            EndpointLock.objects.alias(may_start=EndpointMayStart("endpoint__"))
            .filter(holder__isnull=True, may_start=True)
            .values_list("endpoint_id", flat=True)
        )
        for endpoint_id in free:
            oldest = (
                Ticket.objects.filter(endpoint_id=endpoint_id, state=TicketState.QUEUED)
                .order_by("id")
                .values_list("id", "updated_at")
                .first()
            )
            if oldest and oldest[1] <= cutoff:
                candidates.append(oldest[0])
        if not candidates:
            return []
        waiting = messages_in_flight(
            RUN_TICKET,
            {str(c) for c in candidates},
            workers=_live_workers(settings.CELERY_TASK_DEFAULT_QUEUE),
        )
        lost = [c for c in candidates if waiting is None or str(c) not in waiting]
        if lost:
            publish_now(RUN_TICKET, [str(c) for c in lost])
    if waiting:  # routine while every slot is busy
        log.debug(
            "%d queued ticket(s) wait for a free worker slot; their messages are in flight",
            len(waiting),
        )
    if lost:
        log.warning("re-dispatched %d queued ticket(s) whose messages were lost", len(lost))
    return lost


def _live_workers(queue: str) -> int:
    """Workers consuming ``queue`` that heartbeated within WORKER_LOST_AFTER_S."""
    seen = timezone.now() - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    return Worker.objects.filter(last_seen_at__gte=seen, queues__contains=[queue]).count()
