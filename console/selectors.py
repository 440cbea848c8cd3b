"""Console-only reads. Shared reads (tickets, lineage, events, is_owner) stay
in their apps' selectors; what is here exists to draw a page.

Every query is bounded: the ledger grows without limit, so nothing here
counts or scans a whole table to draw a page. Lists are keyset-paginated or
capped, and counts by state are capped (``STATE_COUNT_CAP``).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Q
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from config.errors import Invalid
from endpoints.models import Endpoint, EndpointAlias, EndpointState, Turn
from recovery.models import CaseEvidence, CaseState, Decision, Inspection, Lesson, RecoveryCase
from tickets import selectors as ticket_selectors
from tickets.models import (
    Delivery,
    DeliveryAttempt,
    ObligationState,
    Ticket,
    TicketState,
)

# Counting every succeeded ticket would read the whole index; past this many
# the dashboard says "10000+" instead.
STATE_COUNT_CAP = 10_000
LIST_CAP = 200
OBLIGATIONS_PAGE = 100


# --- Dashboard ------------------------------------------------------------------------------


@dataclass
class StateCount:
    state: str
    count: int
    capped: bool


def ticket_state_counts(*, cap: int = STATE_COUNT_CAP) -> list[StateCount]:
    """One bounded query per state: ``COUNT(*)`` over ``LIMIT cap + 1`` rows of
    the ``(state, -id)`` index, so a large ledger costs at most ``cap`` index
    entries per state rather than a full scan."""
    counts = []
    for state in TicketState.values:
        n = Ticket.objects.filter(state=state).order_by()[: cap + 1].count()
        counts.append(StateCount(state=state, count=min(n, cap), capped=n > cap))
    return counts


def quarantined_endpoints() -> list[Endpoint]:
    """Quarantined endpoints, each with ``.case``: its newest case that is not
    closed (the one an owner has to work on), or None."""
    endpoints = list(Endpoint.objects.filter(state=EndpointState.QUARANTINED).order_by("address"))
    cases: dict[int, RecoveryCase] = {}
    for case in (
        RecoveryCase.objects.filter(
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


def _open_obligations():
    # Only tickets that answer to a requester carry an obligation: roots, and
    # re-runs (which have a parent, the ticket they replace, but take over its
    # obligation). So the state alone selects them, not ``parent IS NULL``.
    # The partial index ticket_obligation_open_idx covers exactly these rows.
    return Ticket.objects.filter(obligation_state=ObligationState.OPEN).select_related(
        "endpoint", "turn"
    )


def overdue_obligations(*, limit: int = 20) -> list[Ticket]:
    now = timezone.now()
    return list(
        _open_obligations()
        .filter(Q(obligation_due_at__lt=now) | Q(obligation_overdue=True))
        .order_by("obligation_due_at", "id")[:limit]
    )


def recent_tickets(*, limit: int = 20) -> list[Ticket]:
    rows, _ = ticket_selectors.list_tickets(limit=limit)
    return rows


# --- Obligations -------------------------------------------------------------------------------


def _encode_obligation_cursor(ticket: Ticket) -> str:
    raw = f"{ticket.obligation_due_at.isoformat()}|{ticket.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_obligation_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        due, ticket_id = raw.split("|", 1)
        parsed = parse_datetime(due)
        if parsed is None:
            raise ValueError(due)
        return parsed, uuid.UUID(ticket_id)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise Invalid("cursor is not one this page gave out") from None


def open_obligations(
    *, cursor: str | None = None, limit: int = OBLIGATIONS_PAGE
) -> tuple[list[Ticket], str | None]:
    """Open obligations of root tickets, soonest due first, so the overdue
    ones (due in the past) lead. Keyset-paginated on ``(due_at, id)``, which
    the partial index on open obligations serves."""
    qs = _open_obligations().filter(obligation_due_at__isnull=False)
    if cursor:
        due, ticket_id = _decode_obligation_cursor(cursor)
        qs = qs.filter(Q(obligation_due_at__gt=due) | Q(obligation_due_at=due, id__gt=ticket_id))
    rows = list(qs.order_by("obligation_due_at", "id")[: limit + 1])
    next_cursor = _encode_obligation_cursor(rows[limit - 1]) if len(rows) > limit else None
    now = timezone.now()
    for row in rows:
        row.is_overdue = row.obligation_overdue or row.obligation_due_at < now
    return rows[:limit], next_cursor


# --- Tickets -----------------------------------------------------------------------------------


@dataclass
class TicketDetail:
    ticket: Ticket
    payload: dict[str, Any]
    events: list
    turns: list[Turn]
    delivery: Delivery | None
    attempts: list[DeliveryAttempt] = field(default_factory=list)
    children: list[Ticket] = field(default_factory=list)
    reruns: list[Ticket] = field(default_factory=list)


def ticket_detail(ticket_id: uuid.UUID) -> TicketDetail:
    ticket = ticket_selectors.get_ticket(ticket_id)
    delivery = Delivery.objects.filter(ticket_id=ticket.id).first()
    return TicketDetail(
        ticket=ticket,
        payload=ticket_selectors.ticket_payload(ticket),
        events=ticket_selectors.ticket_events(ticket.id),
        # Usually one; the turn index on ticket_id keeps this cheap.
        turns=list(Turn.objects.filter(ticket_id=ticket.id).order_by("seq")),
        delivery=delivery,
        attempts=list(delivery.attempt_log.order_by("number")[:50]) if delivery else [],
        reruns=list(Ticket.objects.filter(rerun_of_id=ticket.id).order_by("id")),
        children=list(
            Ticket.objects.filter(parent_id=ticket.id)
            .select_related("endpoint")
            .order_by("id")[:LIST_CAP]
        ),
    )


def endpoint_choices() -> list[str]:
    return list(Endpoint.objects.order_by("address").values_list("address", flat=True))


# --- Traces --------------------------------------------------------------------------------------


@dataclass
class TraceRow:
    node: dict[str, Any]
    level: int


def trace_tree(trace_id: str) -> tuple[dict[str, Any], list[TraceRow]]:
    """The trace's lineage as a pre-order list of rows with their nesting
    level (parents before children, siblings oldest first). A trace holds at
    most ``TRACE_HARD_LIMIT`` tickets, so reading it whole is bounded."""
    anchor = Ticket.objects.filter(trace_id=trace_id).order_by("id").first()
    if anchor is None:
        raise Http404(f"trace {trace_id} not found")
    tree = ticket_selectors.lineage(anchor)
    nodes = tree["nodes"]
    ids = {n["id"] for n in nodes}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for node in nodes:
        # A parent outside the trace (should not happen) shows as a root.
        parent = node["parent"] if node["parent"] in ids else None
        children.setdefault(parent, []).append(node)
    rows: list[TraceRow] = []
    stack = [(n, 0) for n in reversed(children.get(None, []))]
    while stack:  # iterative: a deep trace cannot hit the recursion limit
        node, level = stack.pop()
        rows.append(TraceRow(node=node, level=level))
        stack.extend((c, level + 1) for c in reversed(children.get(node["id"], [])))
    return tree, rows


# --- Endpoints -----------------------------------------------------------------------------------


def endpoint_rows() -> list[Endpoint]:
    """All endpoints with their lock, queued count and open case. Endpoints
    are configuration (few rows); the queued count reads the partial index
    of queued tickets, one grouped query for all endpoints."""
    endpoints = list(Endpoint.objects.select_related("lock").order_by("address"))
    queued = dict(
        Ticket.objects.filter(state=TicketState.QUEUED)
        .values_list("endpoint_id")
        .annotate(n=Count("id"))
        .values_list("endpoint_id", "n")
    )
    open_cases = dict(
        RecoveryCase.objects.filter(state=CaseState.OPEN).values_list("endpoint_id", "id")
    )
    for endpoint in endpoints:
        endpoint.queued = queued.get(endpoint.id, 0)
        endpoint.open_case = open_cases.get(endpoint.id)
    return endpoints


def get_endpoint(address: str) -> Endpoint:
    endpoint = (
        Endpoint.objects.filter(address=address).select_related("lock", "lock__holder").first()
    )
    if endpoint is None:
        alias = EndpointAlias.objects.filter(alias=address).select_related("endpoint").first()
        if alias is None:
            raise Http404(f"endpoint {address} not found")
        endpoint = alias.endpoint
    return endpoint


def lock_holder(endpoint: Endpoint) -> Turn | None:
    """The turn holding the endpoint's lock, or None (every endpoint has its
    lock row from creation; a missing one reads as free)."""
    lock = getattr(endpoint, "lock", None)
    return lock.holder if lock is not None and lock.holder_id else None


def recent_turns(endpoint: Endpoint, *, limit: int = 20) -> list[Turn]:
    # turn_seq_unique (endpoint, seq) serves this newest-first read.
    return list(
        Turn.objects.filter(endpoint_id=endpoint.id)
        .select_related("ticket")
        .order_by("-seq")[:limit]
    )


def endpoint_cases(endpoint: Endpoint, *, limit: int = 10) -> list[RecoveryCase]:
    return list(RecoveryCase.objects.filter(endpoint_id=endpoint.id).order_by("-opened_at")[:limit])


# --- Recovery ------------------------------------------------------------------------------------
# Case and lesson lists come from recovery.selectors; what is here draws one case.


@dataclass
class CaseDetail:
    case: RecoveryCase
    evidence: list[CaseEvidence]
    inspections: list[Inspection]
    decisions: list[Decision]
    lesson: Lesson | None


def get_case(case_id: uuid.UUID) -> RecoveryCase:
    case = (
        RecoveryCase.objects.select_related("endpoint", "ticket", "turn").filter(id=case_id).first()
    )
    if case is None:
        raise Http404(f"case {case_id} not found")
    return case


def case_detail(case: RecoveryCase) -> CaseDetail:
    inspections = list(
        Inspection.objects.filter(case_id=case.id).select_related("actor").order_by("created_at")
    )
    return CaseDetail(
        case=case,
        evidence=list(CaseEvidence.objects.filter(case_id=case.id).order_by("id")),
        inspections=inspections,
        decisions=list(
            Decision.objects.filter(case_id=case.id)
            .select_related("actor", "inspection", "rerun_ticket")
            .order_by("created_at")
        ),
        lesson=Lesson.objects.filter(case_id=case.id).select_related("actor").first(),
    )


def case_inspections(case_id: uuid.UUID):
    """The inspections a decision on this case may rest on (form choices)."""
    return Inspection.objects.filter(case_id=case_id).order_by("-created_at")
