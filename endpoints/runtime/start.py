"""Starting a turn: the lock row, the fencing token (``seq``), the Turn row
and its token; ``queued -> running``."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from config import observe
from tickets import lifecycle
from tickets.ids import new_id
from tickets.models import Ticket, TicketState

from ..models import (
    Endpoint,
    EndpointLock,
    EndpointState,
    Turn,
    TurnState,
)
from . import fastpath
from .dispatch import mark_needs_dispatch

log = logging.getLogger(__name__)


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


@dataclass
class Started:
    turn: Turn
    ticket: Ticket
    endpoint: Endpoint
    # The turn's credential for the turn API, for its runner only: the Turn
    # row keeps just its SHA-256 (token_sha256).
    token: str = field(default="", repr=False)
    # The start statement already pointed this worker's registry slot at the turn.
    slot_recorded: bool = False


def turn_token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start_turn(
    *, ticket_id: uuid.UUID, celery_task_id: str = "", slot: tuple[str, int] | None = None
) -> Started | None:
    """Start the next turn of the endpoint a dispatch message names
    (DESIGN.md flow 2). Returns None when there is nothing to do.

    1. A ticket no longer ``queued`` means a duplicate message: do nothing.
    2. Lock the endpoint's lock row. Held, or endpoint quarantined: leave the
       ticket queued, marked ``needs_dispatch`` (the release publishes it; a
       quarantined endpoint dispatches nothing).
    3. Take the endpoint's *oldest* queued ticket (FIFO per endpoint), skipping
       rows another transaction holds (a cancel in flight). If that is not the
       message's ticket, the message's ticket needs a dispatch now.
    4. ``seq = ++turn_seq``; create the Turn with the SHA-256 of a fresh
       random token (the runner gets the token itself); make it the lock
       holder and the ticket's registered turn; ticket ``queued -> running``;
       events.

    On PostgreSQL all of it is one statement (``fastpath.start``) with the
    same guards; the general path below is SQLite's.
    """
    if fastpath.enabled():
        return _start_fast(ticket_id=ticket_id, celery_task_id=celery_task_id, slot=slot)
    endpoint_id = (
        Ticket.objects.filter(id=ticket_id, state=TicketState.QUEUED)
        .values_list("endpoint_id", flat=True)
        .first()
    )
    if endpoint_id is None:
        return None  # unknown or no longer queued: a duplicate message
    with transaction.atomic():
        lock = (
            EndpointLock.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .get(endpoint_id=endpoint_id)
        )
        if lock.holder_id is not None:
            mark_needs_dispatch(ticket_id)
            return None
        # Read the clock only once the lock is ours: the turn's interval then
        # lies inside the lock's tenure.
        now = timezone.now()
        ticket = (
            Ticket.objects.select_for_update(skip_locked=True)
            .filter(endpoint_id=endpoint_id, state=TicketState.QUEUED)
            .order_by("id")
            .first()
        )
        if ticket is None:
            return None
        # The fencing token: strictly increasing per endpoint. turn_seq only
        # moves here, under the lock row we hold, so the value we read is the
        # current one; the UPDATE still checks it, and that the endpoint is
        # available (quarantine fails closed).
        endpoint = lock.endpoint
        seq = endpoint.turn_seq + 1
        bumped = Endpoint.objects.filter(
            id=endpoint_id, state=EndpointState.AVAILABLE, turn_seq=seq - 1
        ).update(turn_seq=seq)
        if not bumped:
            mark_needs_dispatch(ticket_id)
            return None
        endpoint.turn_seq = seq
        if ticket.id != ticket_id:
            mark_needs_dispatch(ticket_id)
        token = secrets.token_urlsafe(32)
        turn = Turn.objects.create(
            endpoint=endpoint,
            ticket=ticket,
            seq=seq,
            state=TurnState.RUNNING,
            runner_kind=endpoint.runner.get("kind", ""),
            celery_task_id=celery_task_id or "",
            worker=worker_identity(),
            started_at=now,
            heartbeat_at=now,
            deadline_at=now + timedelta(seconds=endpoint.turn_budget_s),
            token_sha256=turn_token_sha256(token),
        )
        EndpointLock.objects.filter(endpoint_id=endpoint_id, holder__isnull=True).update(
            holder=turn, token=turn.seq, acquired_at=now
        )
        lifecycle.transition(
            ticket_id=ticket.id,
            expected=TicketState.QUEUED,
            to=TicketState.RUNNING,
            kind="turn_started",
            actor=f"worker:{turn.worker['host']}:{turn.worker['pid']}",
            turn_id=turn.id,
            # The seq alone: the event names its turn, whose row keeps the
            # deadline (set here, never changed, pruned with the event).
            detail={"seq": turn.seq},
            turn=turn,
        )
    ticket.state, ticket.turn = TicketState.RUNNING, turn  # as written above
    return Started(turn=turn, ticket=ticket, endpoint=endpoint, token=token)


def _start_fast(
    *, ticket_id: uuid.UUID, celery_task_id: str, slot: tuple[str, int] | None
) -> Started | None:
    token = secrets.token_urlsafe(32)
    worker = worker_identity()
    written = fastpath.start(
        ticket_id=ticket_id,
        turn_id=new_id(),
        celery_task_id=celery_task_id,
        worker=worker,
        token_sha256=turn_token_sha256(token),
        actor=f"worker:{worker['host']}:{worker['pid']}",
        slot=slot,
    )
    if written is None:
        return None
    endpoint, turn, ticket = written
    # What lifecycle.transition reports for the turn_started edge (metrics; in
    # autocommit the statement has committed, so they count at once).
    observe.transition(
        ticket_id=ticket.id,
        expected=TicketState.QUEUED,
        to=TicketState.RUNNING,
        kind="turn_started",
        turn_id=turn.id,
        fields={"turn": turn},
    )
    return Started(
        turn=turn, ticket=ticket, endpoint=endpoint, token=token, slot_recorded=slot is not None
    )


def started_by(celery_task_id: str) -> Started | None:
    # Running turns only: the partial index on active turns keeps this small.
    turn = (
        Turn.objects.select_related("ticket", "endpoint")
        .filter(state=TurnState.RUNNING, celery_task_id=celery_task_id)
        .first()
    )
    if turn is None or turn.worker != worker_identity():
        return None
    # The token made by the lost attempt died with its reply: issue a new one
    # (only the hash is stored, so the old one cannot be recovered).
    token = secrets.token_urlsafe(32)
    if not Turn.objects.filter(id=turn.id, state=TurnState.RUNNING).update(
        token_sha256=turn_token_sha256(token)
    ):
        return None
    return Started(turn=turn, ticket=turn.ticket, endpoint=turn.endpoint, token=token)
