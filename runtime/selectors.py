"""Reads of the runtime: the endpoint as it runs (its record with its lock,
queue and open case), a turn by its token, the workers and their slots."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.times import iso
from endpoints import runner_spec
from endpoints.models import Endpoint
from endpoints.selectors import (
    pause_payload,
    requires_second_person,
    sees_configuration,
    submitters_payload,
)
from tickets.models import TURN_ACTIVE_STATES, EndpointLock, Ticket, TicketState, Turn, TurnState
from tickets.rules import EndpointMayStart
from tickets.selectors import visible_tickets
from tickets.turns import slots

from .models import Worker, WorkerSlot

# A well-formed hash no token has, compared against when the turn is unknown,
# so an unknown turn costs the same comparison as a wrong token.
_NO_TURN_SHA256 = "0" * 64


def turn_for_token(turn_id: object, token: str) -> Turn | None:
    """The turn, if ``token`` is the credential issued to exactly this turn
    (its SHA-256 equals the turn's ``token_sha256``, compared in constant
    time); otherwise None. A user's API key, another turn's token or a turn
    from before tokens (empty hash) never match."""
    try:
        turn = Turn.objects.select_related("endpoint").filter(id=uuid.UUID(str(turn_id))).first()
    except ValueError:
        turn = None
    expected = turn.token_sha256 if turn is not None and turn.token_sha256 else _NO_TURN_SHA256
    given = hashlib.sha256(token.encode()).hexdigest()
    if not hmac.compare_digest(given, expected) or turn is None:
        return None
    return turn


def endpoint_payload(endpoint: Endpoint, *, user) -> dict[str, Any]:
    """The endpoint as the API and the console show it to ``user``, read in
    one snapshot: outside a caller's transaction, its reads run in one
    REPEATABLE READ transaction (the endpoint row read again in
    it): read one by one, a turn starting between two reads would show a
    held lock beside a queue that still counts its ticket.
    The runner's settings and the submitter list only to its owners and
    staff (``sees_configuration``); to others ``runner`` is ``{kind}`` and
    ``submitters`` is left out."""
    full = sees_configuration(user, endpoint)
    if connection.in_atomic_block:
        return _endpoint_payload(endpoint, full=full)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return _endpoint_payload(
            Endpoint.objects.select_related("owners").get(id=endpoint.id), full=full
        )


def _endpoint_payload(endpoint: Endpoint, *, full: bool) -> dict[str, Any]:
    lock = EndpointLock.objects.filter(endpoint=endpoint).first()
    case = endpoint.quarantine_case
    configuration: dict[str, Any] = (
        {
            "runner": endpoint.runner,
            "submitters": submitters_payload(endpoint),
            "notes": endpoint.notes,
            "change_requires_second_person": requires_second_person(endpoint),
        }
        if full
        else {"runner": runner_spec.public_view(endpoint.runner)}
    )
    return {
        "address": endpoint.address,
        "aliases": list(endpoint.aliases.values_list("alias", flat=True)),
        **configuration,
        "owners": (
            sorted(endpoint.owners.user_set.values_list("username", flat=True))
            if endpoint.owners_id
            else []
        ),
        "state": endpoint.state,
        "lock": {
            "holder_turn": str(lock.holder_id) if lock and lock.holder_id else None,
            "token": lock.token if lock else None,
            "acquired_at": iso(lock.acquired_at) if lock else None,
        },
        "queued": Ticket.objects.filter(endpoint=endpoint, state=TicketState.QUEUED).count(),
        "turn_seq": endpoint.turn_seq,
        "generation": endpoint.generation,
        "turn_budget_s": endpoint.turn_budget_s,
        "interrupt_grace_s": endpoint.interrupt_grace_s,
        "heartbeat_timeout_s": endpoint.heartbeat_timeout_s,
        "requires_approval": endpoint.requires_approval,
        "busy_policy": endpoint.busy_policy,
        "open_case": str(case) if case else None,
        "paused": pause_payload(endpoint, full=full),
    }


def visible_turns(endpoint: Endpoint, *, user, limit: int = 20) -> list[Turn]:
    """The endpoint's newest turns, each with its ticket: every one to its
    owners and staff, to anyone else those whose tickets they may see.
    turn_seq_unique (endpoint, seq) serves the newest-first read."""
    turns = Turn.objects.filter(endpoint_id=endpoint.id)
    if not sees_configuration(user, endpoint):
        turns = turns.filter(ticket__in=visible_tickets(user))
    return list(turns.select_related("ticket").order_by("-seq")[:limit])


def sees_workers(user) -> bool:
    """May ``user`` see the worker registry? Staff only: it names hosts and
    process ids."""
    return bool(user is not None and user.is_authenticated and user.is_staff)


def _slot_payload(slot: WorkerSlot, turn: Turn | None, now) -> dict[str, Any]:
    """``turn``: the newest turn started in the slot (tickets/turns/slots.py),
    which it runs until it lets go of it."""
    if turn is None or turn.released_at is not None:
        # Idle since its process let go of its last turn, or since the row
        # was made (a new process).
        since = slot.updated_at
        if turn is not None and turn.released_at > since:
            since = turn.released_at
        return {
            "pid": slot.pid,
            "child_pid": slot.child_pid,
            "status": "idle",
            "turn": None,
            "since": iso(since),
        }
    ticket_state = turn.ticket.state
    if turn.state not in TURN_ACTIVE_STATES or ticket_state != "running":
        # A quarantined or decided turn whose callable still occupies the process.
        status = "held"
    elif turn.state == TurnState.INTERRUPTING:
        status = "interrupting"
    else:
        status = "running"
    # The process that runs the turn: an isolated one runs in the slot's
    # warm turn process, an inline one in the pool process itself.
    isolated = runner_spec.runs_isolated(turn.endpoint.runner)
    return {
        "pid": slot.pid,
        "child_pid": slot.child_pid,
        "status": status,
        "turn": {
            "pid": slot.child_pid if isolated and slot.child_pid else slot.pid,
            "isolated": isolated,
            "id": str(turn.id),
            "seq": turn.seq,
            "state": turn.state,
            "endpoint": turn.endpoint.address,
            "ticket": str(turn.ticket_id),
            "ticket_state": ticket_state,
            "budget_left_s": round(max(0.0, (turn.deadline_at - now).total_seconds()), 1),
        },
        "since": iso(turn.started_at),
    }


def workers_overview() -> dict[str, Any]:
    """Every registered worker and its slots (idle, running, interrupting,
    held), the queues it consumes now, lost workers, and the (unpaused)
    endpoints whose queued tickets wait while every slot of the live workers
    consuming turns is busy."""
    now = timezone.now()
    lost_before = now - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    workers = []
    free, held = 0, []
    by_worker: dict[int, list[WorkerSlot]] = {}
    for slot in WorkerSlot.objects.order_by("pid"):
        by_worker.setdefault(slot.worker_id, []).append(slot)
    registered = list(Worker.objects.order_by("name"))
    # Each slot's newest turn, from the ledger: one index probe per slot.
    turns = slots.newest_turns(
        [slots.slot_key(w.name, s.pid) for w in registered for s in by_worker.get(w.id, [])]
    )
    turn_workers = 0
    for w in registered:
        lost = w.last_seen_at < lost_before
        rows = [
            _slot_payload(s, turns.get(slots.slot_key(w.name, s.pid)), now)
            for s in by_worker.get(w.id, [])
        ]
        busy = sum(1 for r in rows if r["status"] != "idle")
        # A worker whose consuming of turns staff stopped takes none: its
        # free slots feed nothing.
        if not lost and "turns" in w.consuming:
            turn_workers += 1
            free += max(0, w.pool_size - busy)
            held += [r["turn"]["id"] for r in rows if r["status"] == "held"]
        workers.append(
            {
                "name": w.name,
                "host": w.host,
                "pid": w.pid,
                "queues": w.queues,
                "pool_size": w.pool_size,
                "started_at": iso(w.started_at),
                "last_seen_at": iso(w.last_seen_at),
                "status": "lost" if lost else "alive",
                "consuming": w.consuming,
                "busy": busy,
                "slots": rows,
            }
        )
    starved = []
    if turn_workers == 0 or free == 0:
        starved = sorted(
            set(
                Ticket.objects.alias(may_start=EndpointMayStart("endpoint__"))
                .filter(state=TicketState.QUEUED, may_start=True)
                .values_list("endpoint__address", flat=True)
            )
        )
    return {"workers": workers, "held_turns": held, "starved_endpoints": starved}


def slot_holding(turn_id) -> WorkerSlot | None:
    """The slot of a live worker whose pool process still runs ``turn_id``."""
    key = slots.slot_of(turn_id)
    if key is None:
        return None
    alive_after = timezone.now() - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    live = WorkerSlot.objects.select_related("worker").filter(worker__last_seen_at__gte=alive_after)
    return next((s for s in live if slots.slot_key(s.worker.name, s.pid) == key), None)


def slot_runs(worker: str, pid: int, turn_id) -> bool:
    """Whether the pool process ``pid`` of the worker named ``worker`` still
    runs ``turn_id``: checked before that process is killed."""
    return slots.runs(slots.slot_key(worker, pid), turn_id)
