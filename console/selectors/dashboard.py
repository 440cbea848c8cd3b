"""The dashboard: tickets by state, what needs an owner (quarantines,
pauses, overdue obligations, results awaiting approval, changes to
review), the last hour's throughput and the platform's capacity."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from endpoints import generation_selectors
from endpoints.models import Endpoint, EndpointState
from endpoints.selectors import sees_configuration
from health.checks import readiness
from recovery.models import CaseState, RecoveryCase
from recovery.selectors import visible_cases
from runtime.selectors import workers_overview
from tickets import selectors as ticket_selectors
from tickets.models import Ticket, TicketState
from tickets.selectors import visible_tickets

from .charts import last_hour
from .obligations import overdue_obligations

# Counting every succeeded ticket would read the whole index; past this many
# the dashboard says "10000+" instead.
STATE_COUNT_CAP = 10_000


@dataclass
class StateCount:
    state: str
    count: int
    capped: bool


def ticket_state_counts(*, user, cap: int = STATE_COUNT_CAP) -> list[StateCount]:
    """The user's visible tickets by state. One bounded query per state:
    ``COUNT(*)`` over ``LIMIT cap + 1`` rows, so a large ledger costs at most
    ``cap`` index entries per state rather than a full scan."""
    counts = []
    visible = visible_tickets(user)
    for state in TicketState.values:
        n = visible.filter(state=state).order_by()[: cap + 1].count()
        counts.append(StateCount(state=state, count=min(n, cap), capped=n > cap))
    return counts


def quarantined_endpoints(*, user) -> list[Endpoint]:
    """Quarantined endpoints (everyone sees endpoints), each with ``.case``:
    its newest case that is not closed (the one an owner has to work on), if
    the user may see it, or None."""
    endpoints = list(Endpoint.objects.filter(state=EndpointState.QUARANTINED).order_by("address"))
    cases: dict[int, RecoveryCase] = {}
    for case in (
        visible_cases(user)
        .filter(
            endpoint_id__in=[e.id for e in endpoints],
            state__in=[CaseState.OPEN, CaseState.DECIDED],
        )
        .select_related("ticket", "turn")
        .order_by("opened_at")
    ):
        cases[case.endpoint_id] = case  # newest wins
    for endpoint in endpoints:
        endpoint.case = cases.get(endpoint.id)
    return endpoints


def paused_endpoints(*, user) -> list[Endpoint]:
    """Endpoints their owners paused (everyone sees endpoints; who paused and
    why only its owners and staff, as ``.sees_why``), each with ``.queued``
    (the tickets waiting on the resume) and ``.running`` (a turn still
    draining). Few rows: a pause is an owner's act."""
    endpoints = list(
        Endpoint.objects.filter(paused_at__isnull=False)
        .select_related("lock")
        .annotate(queued=Count("tickets", filter=Q(tickets__state=TicketState.QUEUED)))
        .order_by("paused_at")
    )
    for endpoint in endpoints:
        endpoint.sees_why = sees_configuration(user, endpoint)
        endpoint.running = endpoint.lock.holder_id is not None
    return endpoints


# A worker that stopped heartbeating longer ago than this is history (a host
# scaled down), not news: the dashboard stops flagging it; /workers still lists it.
LOST_WORKER_FLAG_S = 3600


def capacity_flags() -> dict[str, Any]:
    """What the dashboard flags about capacity (issue 11): slots held by a
    turn whose ticket already left ``running`` (the callable still occupies
    its process), workers lost within the hour, and endpoints whose queued
    tickets wait while every turns slot is busy. Counts and endpoint
    addresses only (everyone sees endpoints); hosts and pids stay on the
    staff-only workers page."""
    overview = workers_overview()
    recent = timezone.now() - timedelta(seconds=LOST_WORKER_FLAG_S)
    lost = sum(
        1
        for w in overview["workers"]
        if w["status"] == "lost" and datetime.fromisoformat(w["last_seen_at"]) >= recent
    )
    return {
        "held": len(overview["held_turns"]),
        "lost": lost,
        "starved": overview["starved_endpoints"],
        "any": bool(overview["held_turns"] or lost or overview["starved_endpoints"]),
    }


def recent_tickets(*, user, limit: int = 20) -> list[Ticket]:
    rows, _ = ticket_selectors.list_tickets(user=user, limit=limit)
    return rows


def dashboard_page(*, user, span: str | None) -> dict[str, Any]:
    """Everything the dashboard shows ``user``; ``span`` is the chart's range."""
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    awaiting, awaiting_more = ticket_selectors.awaiting_approval(user=user)
    return {
        "counts": ticket_state_counts(user=user),
        "count_cap": STATE_COUNT_CAP,
        "quarantined": quarantined_endpoints(user=user),
        "paused": paused_endpoints(user=user),
        "overdue": overdue_obligations(user=user),
        "recent": recent_tickets(user=user),
        "hour": last_hour(user=user, span=span),
        "awaiting": awaiting,
        "awaiting_more": awaiting_more,
        "review_queue": [
            generation_selectors.proposal_payload(p, user=user)
            for p in generation_selectors.review_queue(user, limit=20)
        ],
        "capacity": capacity_flags(),
        # Database, broker and sweepers, as /readyz sees them.
        "readiness": readiness(probe_database=False),
        "live_token": live_token,
    }
