"""Reads of endpoints shared by services, the API and the console."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Q

from core.errors import NotFound
from tickets.selectors import iso

from . import runner_spec
from .models import (
    TURN_ACTIVE_STATES,
    BusyPolicy,
    Endpoint,
    EndpointAlias,
    EndpointLock,
    EndpointState,
    Turn,
    TurnState,
    Worker,
    WorkerSlot,
)
from .ports import open_case_id


def resolve_endpoint(address: str) -> Endpoint:
    """The canonical endpoint for an address or one of its aliases."""
    if not isinstance(address, str) or not address:
        raise NotFound("endpoint address is empty")
    endpoint = Endpoint.objects.filter(address=address).first()
    if endpoint is None:
        alias = EndpointAlias.objects.select_related("endpoint").filter(alias=address).first()
        if alias is None:
            raise NotFound(f"endpoint {address!r} not found")
        endpoint = alias.endpoint
    return endpoint


def owned_endpoint_ids(user) -> list[int] | None:
    """The ids of the endpoints ``user`` owns; None for staff, who act as
    owners of every endpoint (callers read None as "no filter"). Endpoints
    are configuration (few rows): one small query through the user's groups,
    kept on the user object like Django's own permission cache, so a page
    that filters several panels asks once (a request loads its user afresh)."""
    if user is None or not user.is_authenticated:
        return []
    if user.is_staff:
        return None
    cached = getattr(user, "_claimcheck_owned_endpoints", None)
    if cached is None:
        cached = list(
            Endpoint.objects.filter(owners__user=user).order_by().values_list("id", flat=True)
        )
        user._claimcheck_owned_endpoints = cached
    return cached


def may_submit(user, endpoint: Endpoint) -> bool:
    """May ``user`` submit tickets to ``endpoint``? Anyone may, unless the
    endpoint is ``submit_restricted``: then the listed users, members of the
    listed groups, its owners and staff. One query, and only for a restricted
    endpoint."""
    if not endpoint.submit_restricted:
        return True
    if user is None or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    users = Endpoint.submitter_users.through.objects.filter(endpoint_id=endpoint.id)
    groups = Endpoint.submitter_groups.through.objects.filter(endpoint_id=endpoint.id)
    allowed = Q(id__in=users.values("user_id")) | Q(groups__in=groups.values("group_id"))
    if endpoint.owners_id is not None:
        allowed |= Q(groups__id=endpoint.owners_id)
    return get_user_model().objects.filter(allowed, id=user.id).exists()


def submitters_payload(endpoint: Endpoint) -> dict[str, list[str]] | None:
    """``{users, groups}`` (names, sorted) of a restricted endpoint, else None."""
    if not endpoint.submit_restricted:
        return None
    return {
        "users": sorted(endpoint.submitter_users.values_list("username", flat=True)),
        "groups": sorted(endpoint.submitter_groups.values_list("name", flat=True)),
    }


def is_owner(user, endpoint: Endpoint) -> bool:
    """Owners are the members of the endpoint's owners group; staff act as owners."""
    if user is None or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    return endpoint.owners_id is not None and user.groups.filter(id=endpoint.owners_id).exists()


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


def requires_second_person(endpoint: Endpoint) -> bool:
    """May a proposer not approve their own change? The endpoint's own
    setting, else the global CHANGE_REQUIRES_SECOND_PERSON."""
    from django.conf import settings

    if endpoint.change_requires_second_person is not None:
        return endpoint.change_requires_second_person
    return settings.CHANGE_REQUIRES_SECOND_PERSON


def is_quarantined(endpoint: Endpoint) -> bool:
    return endpoint.state == EndpointState.QUARANTINED


def rejects_when_busy(endpoint: Endpoint) -> bool:
    return endpoint.busy_policy == BusyPolicy.REJECT


def is_locked(endpoint: Endpoint) -> bool:
    """Is the endpoint's lock held by a turn?"""
    return EndpointLock.objects.filter(endpoint=endpoint, holder__isnull=False).exists()


def sees_configuration(user, endpoint: Endpoint) -> bool:
    """May ``user`` see the endpoint's runner settings and who may submit to
    it (API.md "Runner details are for owners and staff")? Its owners and
    staff; everyone else sees the runner's kind only and no submitter list.
    Reads the user's cached owned ids, so a list asks once."""
    owned = owned_endpoint_ids(user)
    return owned is None or endpoint.id in owned


def endpoint_payload(endpoint: Endpoint, *, user) -> dict[str, Any]:
    """The endpoint as the API and the console show it to ``user``, read in
    one snapshot: outside a caller's transaction, its reads run in one
    REPEATABLE READ transaction (the endpoint row read again in
    it): read one by one, a quarantine committing between two reads would
    show an open case beside the state ``available``.
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
    from tickets.models import Ticket, TicketState

    lock = EndpointLock.objects.filter(endpoint=endpoint).first()
    case = open_case_id(endpoint.id)
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


def pause_payload(endpoint: Endpoint, *, full: bool) -> dict[str, Any] | None:
    """The owners' pause: when; who and why only to owners and staff."""
    if endpoint.paused_at is None:
        return None
    if not full:
        return {"at": iso(endpoint.paused_at)}
    return {
        "at": iso(endpoint.paused_at),
        "by": endpoint.pause_actor,
        "reason": endpoint.pause_reason,
    }


def _slot_payload(slot: WorkerSlot, now) -> dict[str, Any]:
    turn = slot.turn
    if turn is None:
        return {
            "pid": slot.pid,
            "child_pid": slot.child_pid,
            "status": "idle",
            "turn": None,
            "since": iso(slot.updated_at),
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
        "since": iso(slot.since),
    }


def workers_overview() -> dict[str, Any]:
    """Every registered worker and its slots (idle, running, interrupting,
    held), the queues it consumes now, lost workers, and the (unpaused)
    endpoints whose queued tickets wait while every slot of the live workers
    consuming turns is busy."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from tickets.models import Ticket, TicketState

    now = timezone.now()
    lost_before = now - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    workers = []
    free, held = 0, []
    slots = WorkerSlot.objects.select_related("turn__ticket", "turn__endpoint").order_by("pid")
    by_worker: dict[int, list[WorkerSlot]] = {}
    for slot in slots:
        by_worker.setdefault(slot.worker_id, []).append(slot)
    turn_workers = 0
    for w in Worker.objects.order_by("name"):
        lost = w.last_seen_at < lost_before
        rows = [_slot_payload(s, now) for s in by_worker.get(w.id, [])]
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
                Ticket.objects.filter(
                    state=TicketState.QUEUED,
                    endpoint__state=EndpointState.AVAILABLE,
                    endpoint__paused_at__isnull=True,
                ).values_list("endpoint__address", flat=True)
            )
        )
    return {"workers": workers, "held_turns": held, "starved_endpoints": starved}


def slot_holding(turn_id) -> WorkerSlot | None:
    """The slot of a live worker whose pool process still runs ``turn_id``."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    alive_after = timezone.now() - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    return (
        WorkerSlot.objects.select_related("worker")
        .filter(turn_id=turn_id, worker__last_seen_at__gte=alive_after)
        .first()
    )
