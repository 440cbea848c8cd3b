"""Console-only reads. Shared reads (tickets, lineage, events, is_owner) stay
in their apps' selectors; what is here exists to draw a page.

Every query is bounded: the ledger grows without limit, so nothing here
counts or scans a whole table to draw a page. Lists are keyset-paginated or
capped, and counts by state are capped (``STATE_COUNT_CAP``).

Every read on behalf of the logged-in user starts from
``tickets.selectors.visible_tickets`` or ``recovery.selectors.visible_cases``:
a page shows only what its user may see (API.md "Who may see and do what").
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.errors import Invalid
from endpoints.models import Endpoint, EndpointAlias, EndpointEvent, EndpointState
from endpoints.selectors import owned_endpoint_ids
from recovery.models import CaseEvidence, CaseState, Decision, Inspection, Lesson, RecoveryCase
from recovery.selectors import tool_calls, visible_cases
from runtime.models import Turn
from runtime.selectors import workers_overview
from tickets import selectors as ticket_selectors
from tickets.models import (
    TERMINAL_STATES,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    ObligationState,
    Ticket,
    TicketState,
)
from tickets.selectors import visible_tickets

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
    from endpoints.selectors import owned_endpoint_ids

    endpoints = list(
        Endpoint.objects.filter(paused_at__isnull=False)
        .select_related("lock")
        .annotate(queued=Count("tickets", filter=Q(tickets__state=TicketState.QUEUED)))
        .order_by("paused_at")
    )
    owned = owned_endpoint_ids(user)
    for endpoint in endpoints:
        endpoint.sees_why = owned is None or endpoint.id in owned
        endpoint.running = endpoint.lock.holder_id is not None
    return endpoints


PAUSE_EVENTS_SHOWN = 5


def pause_events(endpoint: Endpoint, *, user) -> list[EndpointEvent]:
    """The endpoint's newest pauses and resumes (who, when, why): its owners
    and staff only, as the reasons are."""
    owned = owned_endpoint_ids(user)
    if owned is not None and endpoint.id not in owned:
        return []
    return list(
        EndpointEvent.objects.filter(endpoint=endpoint, kind__in=["paused", "resumed"]).order_by(
            "-id"
        )[:PAUSE_EVENTS_SHOWN]
    )


def _open_obligations(user):
    # Only tickets that answer to a requester carry an obligation: roots, and
    # re-runs (which have a parent, the ticket they replace, but take over its
    # obligation). So the state alone selects them, not ``parent IS NULL``.
    # The partial index ticket_obligation_open_idx covers exactly these rows.
    return (
        visible_tickets(user)
        .filter(obligation_state=ObligationState.OPEN)
        .select_related("endpoint", "turn")
    )


# A finished ticket whose result waits for the requester to pull it (no
# webhook): the platform owes nothing more, the requester has yet to fetch
# and acknowledge. Its obligation stays open until then (tickets.delivery),
# but the console does not call it overdue.
_AWAITING_PICKUP = Q(
    state__in=list(TERMINAL_STATES),
    delivery_state__in=[DeliveryState.PENDING, DeliveryState.ATTEMPTED],
) & (Q(requester__webhook_url__isnull=True) | Q(requester__webhook_url=""))


def awaiting_pickup(ticket: Ticket) -> bool:
    return (
        ticket.is_terminal
        and ticket.delivery_state in (DeliveryState.PENDING, DeliveryState.ATTEMPTED)
        and not (ticket.requester or {}).get("webhook_url")
    )


def requester_lacks(ticket: Ticket) -> str:
    """What the requester of an open obligation still lacks, in words."""
    if not ticket.is_terminal:
        return f"the result: the work is {ticket.state}"
    if ticket.delivery_state == DeliveryState.AWAITING_APPROVAL:
        return "the result: it waits for an owner's approval"
    if awaiting_pickup(ticket):
        if ticket.state != TicketState.SUCCEEDED:
            # A failed, cancelled or orphaned ticket has no result: what is
            # ready is the outcome, and what may be owed is a retry.
            return (
                f"to learn the outcome: the ticket {ticket.state} without a result (ready to "
                "pull); the requester has not acknowledged it, and a retry is an owner's call"
            )
        return "nothing owed: the result is ready to pull; the requester has not acknowledged it"
    if ticket.delivery_state == DeliveryState.FAILED:
        return "the result: its delivery failed"
    if ticket.delivery_state in (DeliveryState.PENDING, DeliveryState.ATTEMPTED):
        return "the result: its webhook delivery is being retried"
    return "an update on the ticket"


def overdue_obligations(*, user, limit: int = 20) -> list[Ticket]:
    """Open obligations past their update time that are really owed: a
    finished result waiting to be pulled is not a debt."""
    now = timezone.now()
    return list(
        _open_obligations(user)
        .filter(Q(obligation_due_at__lt=now) | Q(obligation_overdue=True))
        .exclude(_AWAITING_PICKUP)
        .order_by("obligation_due_at", "id")[:limit]
    )


# The dashboard's ranges: (length, bucket, how many buckets). Counts are
# grouped by minute (1 h) or by hour (24 h, 7 d; at most 168 groups, folded
# into 6-hour buckets for 7 d) in the database.
CHART_RANGES: dict[str, tuple[timedelta, timedelta, int]] = {
    "1h": (timedelta(hours=1), timedelta(minutes=1), 60),
    "24h": (timedelta(hours=24), timedelta(hours=1), 24),
    "7d": (timedelta(days=7), timedelta(hours=6), 28),
}
CHART_LEFT, CHART_WIDTH, CHART_TOP, CHART_HEIGHT = 44, 540, 8, 90


def chart_range(raw: str | None) -> str:
    return raw if raw in CHART_RANGES else "1h"


def _bucket_start(at: datetime, bucket: timedelta) -> datetime:
    seconds = int(bucket.total_seconds())
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=at.tzinfo)


def _ticks(peak: int) -> list[dict[str, Any]]:
    """Y ticks at 0, half and the peak (whole numbers, no repeats)."""
    values = sorted({0, peak // 2, peak} if peak > 1 else {0, peak})
    return [
        {"value": v, "y": CHART_TOP + CHART_HEIGHT - round(CHART_HEIGHT * v / peak)} for v in values
    ]


def last_hour(*, user, span: str = "1h", endpoint: Endpoint | None = None) -> dict[str, Any]:
    """Tickets admitted per bucket over the range and, of those, how many
    finished per bucket; failures grouped by error code; the geometry of a
    server-drawn SVG (bars, axis ticks, labels) and the same figures as rows
    for a table. Ticket ids are UUIDv7, so "admitted in the range" is a
    primary key range: the dashboard never reads older rows. With
    ``endpoint``, that endpoint's tickets only (its (endpoint, -id) index),
    and no failures (its page lists its turns)."""
    from django.db.models.fields.json import KeyTextTransform  # noqa: PLC0415
    from django.db.models.functions import TruncHour, TruncMinute  # noqa: PLC0415

    span = chart_range(span)
    length, bucket, n = CHART_RANGES[span]
    trunc = TruncMinute if bucket < timedelta(hours=1) else TruncHour
    now = timezone.now()
    since = now - length
    recent = visible_tickets(user).filter(id__gte=uuid7_floor(since)).order_by()
    if endpoint is not None:
        recent = recent.filter(endpoint_id=endpoint.id)
    first = _bucket_start(now, bucket) - bucket * (n - 1)

    def grouped(qs, field: str) -> dict[datetime, int]:
        counts: dict[datetime, int] = {}
        for at, count in qs.annotate(m=trunc(field)).values_list("m").annotate(n=Count("id")):
            key = _bucket_start(at, bucket)
            counts[key] = counts.get(key, 0) + count
        return counts

    admitted = grouped(recent, "created_at")
    finished = grouped(recent.filter(finished_at__isnull=False), "finished_at")
    failures = (
        []
        if endpoint is not None
        else list(
            recent.filter(state=TicketState.FAILED)
            .annotate(code=KeyTextTransform("code", "error"))
            .values("code")
            .annotate(n=Count("id"))
            .order_by("-n", "code")[:10]
        )
    )
    starts = [first + bucket * i for i in range(n)]
    peak = max([admitted.get(t, 0) for t in starts] + [finished.get(t, 0) for t in starts] + [1])
    slot = CHART_WIDTH / n
    bar = max(2.0, (slot - 2) / 2)
    base = CHART_TOP + CHART_HEIGHT
    bars = []
    for i, start in enumerate(starts):
        a, f = admitted.get(start, 0), finished.get(start, 0)
        x = CHART_LEFT + i * slot
        ah, fh = round(CHART_HEIGHT * a / peak), round(CHART_HEIGHT * f / peak)
        bars.append(
            {
                "start": start,
                "end": start + bucket,
                "a": a,
                "f": f,
                "slot_x": round(x, 1),
                "slot_w": round(slot, 1),
                "x": round(x + 1, 1),
                "fx": round(x + 1 + bar, 1),
                "w": round(bar, 1),
                "ah": ah,
                "fh": fh,
                "ay": base - ah,
                "fy": base - fh,
            }
        )
    # Five labels along the time axis, the last one "now".
    step = max(1, n // 4)
    x_ticks = [
        {"x": bars[i]["slot_x"], "at": bars[i]["start"], "first": i == 0} for i in range(0, n, step)
    ]
    return {
        "range": span,
        "ranges": list(CHART_RANGES),
        "bucket": bucket,
        "bars": bars,
        "peak": peak,
        "y_ticks": _ticks(peak),
        "x_ticks": x_ticks,
        "daily": bucket >= timedelta(hours=1),
        "left": CHART_LEFT,
        "right": CHART_LEFT + CHART_WIDTH,
        "base": base,
        "admitted": sum(b["a"] for b in bars),
        "finished": sum(b["f"] for b in bars),
        "failures": failures,
        "since": since,
    }


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
    *, user, cursor: str | None = None, limit: int = OBLIGATIONS_PAGE
) -> tuple[list[Ticket], str | None]:
    """Open obligations of root tickets, soonest due first, so the overdue
    ones (due in the past) lead. Keyset-paginated on ``(due_at, id)``, which
    the partial index on open obligations serves."""
    qs = _open_obligations(user).filter(obligation_due_at__isnull=False)
    if cursor:
        due, ticket_id = _decode_obligation_cursor(cursor)
        qs = qs.filter(Q(obligation_due_at__gt=due) | Q(obligation_due_at=due, id__gt=ticket_id))
    rows = list(qs.order_by("obligation_due_at", "id")[: limit + 1])
    next_cursor = _encode_obligation_cursor(rows[limit - 1]) if len(rows) > limit else None
    now = timezone.now()
    for row in rows:
        row.lacks = requester_lacks(row)
        row.is_overdue = not awaiting_pickup(row) and (
            row.obligation_overdue or row.obligation_due_at < now
        )
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


def ticket_detail(ticket_id: uuid.UUID, *, user) -> TicketDetail:
    """A ticket the user may see (else ``NotFound``), with its children and
    re-runs the user may see."""
    ticket = ticket_selectors.get_visible_ticket(ticket_id, user=user)
    visible = visible_tickets(user)
    delivery = Delivery.objects.filter(ticket_id=ticket.id).first()
    return TicketDetail(
        ticket=ticket,
        payload=ticket_selectors.ticket_payload(ticket),
        events=ticket_selectors.ticket_events(ticket.id),
        # Usually one; the turn index on ticket_id keeps this cheap.
        turns=list(Turn.objects.filter(ticket_id=ticket.id).order_by("seq")),
        delivery=delivery,
        attempts=list(delivery.attempt_log.order_by("number")[:50]) if delivery else [],
        reruns=list(visible.filter(rerun_of_id=ticket.id).order_by("id")),
        children=list(
            visible.filter(parent_id=ticket.id).select_related("endpoint").order_by("id")[:LIST_CAP]
        ),
    )


def endpoint_choices() -> list[str]:
    return list(Endpoint.objects.order_by("address").values_list("address", flat=True))


# --- Traces --------------------------------------------------------------------------------------


@dataclass
class TraceRow:
    node: dict[str, Any]
    level: int
    ticket: Ticket | None = None
    kind: str = ""
    case: uuid.UUID | None = None
    warned: bool = False
    # When the ticket went waiting for its children (its turn's end), if it did.
    waited_at: datetime | None = None


def trace_tree(trace_id: str, *, user) -> tuple[dict[str, Any], list[TraceRow]]:
    """The trace's lineage as a pre-order list of rows with their nesting
    level (parents before children, siblings oldest first): only the tickets
    the user may see, and 404 when that is none of them. A trace holds at
    most ``TRACE_HARD_LIMIT`` tickets, so reading it whole is bounded."""
    anchor = visible_tickets(user).filter(trace_id=trace_id).order_by("id").first()
    if anchor is None:
        raise Http404(f"trace {trace_id} not found")
    tree = ticket_selectors.lineage(anchor, user=user)
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
    _add_trace_details(rows, user=user)
    return tree, rows


def _add_trace_details(rows: list[TraceRow], *, user) -> None:
    """Each row's ticket (times, its turn), its kind (root, child, callback,
    re-run, retry), its open case if the user may see it, and the breaker's warning
    on the trace. All reads are by ticket id within one trace, which holds at
    most TRACE_HARD_LIMIT tickets."""
    from tickets.models import TicketEvent  # noqa: PLC0415

    ids = [uuid.UUID(r.node["id"]) for r in rows]
    tickets = {
        t.id: t
        for t in Ticket.objects.filter(id__in=ids)
        .select_related("turn")
        .only(
            "id",
            "created_at",
            "finished_at",
            "callback_for_id",
            "rerun_of_id",
            "retry_of_id",
            "parent_id",
            "state",
            "completed_by_turn_id",
            "turn__started_at",
            "turn__ended_at",
            "turn__seq",
            "turn__state",
        )
    }
    cases = dict(
        visible_cases(user)
        .filter(ticket_id__in=ids, state__in=[CaseState.OPEN, CaseState.DECIDED])
        .values_list("ticket_id", "id")
    )
    # The breaker's warnings and when each ticket went waiting, in one read.
    warned: set[uuid.UUID] = set()
    waited: dict[uuid.UUID, datetime] = {}
    for ticket_id, kind, at in TicketEvent.objects.filter(
        Q(kind="trace_soft_limit") | Q(to_state=TicketState.WAITING), ticket_id__in=ids
    ).values_list("ticket_id", "kind", "at"):
        if kind == "trace_soft_limit":
            warned.add(ticket_id)
        else:
            waited.setdefault(ticket_id, at)
    for row in rows:
        ticket = tickets.get(uuid.UUID(row.node["id"]))
        row.ticket = ticket
        row.case = cases.get(ticket.id) if ticket else None
        row.warned = ticket is not None and ticket.id in warned
        row.waited_at = waited.get(ticket.id) if ticket else None
        if ticket is None:
            row.kind = ""
        elif ticket.callback_for_id:
            row.kind = "callback"
        elif ticket.rerun_of_id:
            row.kind = "re-run"
        elif ticket.retry_of_id:
            row.kind = "retry"
        elif ticket.parent_id:
            row.kind = "child"
        else:
            row.kind = "root"


def trace_active(rows: list[TraceRow]) -> bool:
    return any(r.ticket is not None and not r.ticket.is_terminal for r in rows)


# The waterfall draws at most this many tickets (a trace may hold thousands
# where TRACE_HARD_LIMIT is raised); the lineage table below it lists all.
WATERFALL_CAP = 200
# Each lane is an SVG this many units wide, stretched to its cell.
WATERFALL_WIDTH = 1000
_SPAN_WORDS = {"queued": "queued", "running": "ran", "waiting": "waited", "unknown": "ran"}


@dataclass
class WaterfallSpan:
    kind: str  # queued | running | waiting | unknown (a turn with no known end)
    start: datetime
    end: datetime
    open: bool  # still going: ``end`` is now
    x: float = 0.0
    w: float = 0.0
    text: str = ""


@dataclass
class WaterfallRow:
    row: TraceRow
    spans: list[WaterfallSpan]
    # Whether this callback's turn completed the trace's root; the waiting
    # ticket a callback's turn completed (the root or another) is ``completes``.
    completes_root: bool = False
    completes: uuid.UUID | None = None
    summary: str = ""
    # The figures the lane draws, for its table cells: queued, ran, waited.
    figures: dict[str, str] = field(default_factory=dict)


def _ticket_spans(row: TraceRow, now: datetime) -> list[WaterfallSpan]:
    """A ticket's queued, running and waiting spans from its own times:
    queued from admission to its turn's start (or to its end or now, when
    it never ran); running for its turn, to the turn's end where that is
    known on evidence (else ``unknown``, drawn to the ticket's end or now);
    waiting from the turn's end to the ticket's end (or now)."""
    from console.templatetags.consoletags import ENDED_ON_EVIDENCE  # noqa: PLC0415

    ticket = row.ticket
    if ticket is None:
        return []
    finished = ticket.finished_at
    spans: list[WaterfallSpan] = []
    turn = ticket.turn
    if turn is None:
        end = finished or now
        return [WaterfallSpan("queued", ticket.created_at, end, finished is None)]
    spans.append(WaterfallSpan("queued", ticket.created_at, turn.started_at, False))
    if turn.state in ENDED_ON_EVIDENCE and turn.ended_at:
        run_end, run_open, run_kind = turn.ended_at, False, "running"
    elif turn.state in ("running", "interrupting"):
        run_end, run_open, run_kind = now, True, "running"
    else:  # uncertain, unresolved: nobody knows when (or whether) it ended
        # Drawn to when a decision closed it (the ticket's end), or now.
        end = turn.ended_at or finished
        run_end, run_open, run_kind = end or now, end is None, "unknown"
    if row.waited_at is not None:
        run_end, run_open = min(run_end, row.waited_at), False
    spans.append(WaterfallSpan(run_kind, turn.started_at, run_end, run_open))
    if row.waited_at is not None:
        spans.append(WaterfallSpan("waiting", row.waited_at, finished or now, finished is None))
    return spans


def trace_waterfall(rows: list[TraceRow], *, cap: int | None = None) -> dict[str, Any]:
    """The trace as a timeline: each ticket's spans on one time axis (from
    the trace's first admission to its last end, or now while any ticket is
    in flight), callbacks and re-runs marked by their row's kind, and the
    callback whose turn completed the root found by the root's
    ``completed_by_turn``. Reads nothing: the rows carry every time. At most
    ``cap`` rows are drawn (lineage order), the completing callback always
    among them; ``hidden`` says how many are not."""
    from console.templatetags.consoletags import _span  # noqa: PLC0415

    cap = WATERFALL_CAP if cap is None else cap
    now = timezone.now()
    drawn = [r for r in rows if r.ticket is not None]
    if not drawn:
        return {"rows": [], "hidden": 0, "ticks": [], "total": 0}
    # Which ticket each turn belongs to, to name the callback that completed a ticket.
    by_turn = {r.ticket.turn_id: r.ticket.id for r in drawn if r.ticket.turn_id}
    completed: dict[uuid.UUID, uuid.UUID] = {}  # callback ticket -> the ticket it completed
    root_completer = None
    for r in drawn:
        source = by_turn.get(r.ticket.completed_by_turn_id)
        if source is not None:
            completed[source] = r.ticket.id
            if r.kind == "root":
                root_completer = source
    all_rows = [WaterfallRow(row=r, spans=_ticket_spans(r, now)) for r in drawn]
    start = min(r.row.ticket.created_at for r in all_rows)
    end = max([s.end for r in all_rows for s in r.spans] + [start])
    length = max((end - start).total_seconds(), 0.001)
    shown = all_rows[:cap]
    if root_completer is not None and root_completer not in {r.row.ticket.id for r in shown}:
        shown = [
            *all_rows[: cap - 1],
            next(r for r in all_rows if r.row.ticket.id == root_completer),
        ]
    for wrow in shown:
        ticket = wrow.row.ticket
        wrow.completes = completed.get(ticket.id)
        wrow.completes_root = ticket.id == root_completer
        parts = []
        for span in wrow.spans:
            offset = (span.start - start).total_seconds()
            seconds = max(0.0, (span.end - span.start).total_seconds())
            span.x = round(WATERFALL_WIDTH * offset / length, 1)
            # At least 2 units: a span of a few milliseconds still shows.
            span.w = max(2.0, round(WATERFALL_WIDTH * seconds / length, 1))
            span.x = min(span.x, WATERFALL_WIDTH - span.w)
            word = _SPAN_WORDS[span.kind]
            so_far = " so far" if span.open else ""
            unknown = " (end unknown: no stop evidence)" if span.kind == "unknown" else ""
            span.text = (
                f"{word} {_span(seconds)}{so_far}{unknown} from "
                f"{span.start.astimezone(UTC).strftime('%H:%M:%SZ')}, +{_span(offset)}"
            )
            parts.append(span.text)
        wrow.summary = "; ".join(parts)
        for kind, word in (("queued", "queued"), ("running", "ran"), ("waiting", "waited")):
            spans = [
                s
                for s in wrow.spans
                if s.kind == kind or (kind == "running" and s.kind == "unknown")
            ]
            if spans:
                seconds = sum(max(0.0, (s.end - s.start).total_seconds()) for s in spans)
                open_ = any(s.open for s in spans)
                unknown = any(s.kind == "unknown" for s in spans)
                prefix = "at least " if unknown else ""
                wrow.figures[word] = f"{prefix}{_span(seconds)}{' so far' if open_ else ''}"
    ticks = [
        {
            "at": start + timedelta(seconds=length * i / 4),
            "offset": "+" + _span(length * i / 4) if i else "",
        }
        for i in range(5)
    ]
    return {
        "rows": shown,
        "hidden": len(all_rows) - len(shown),
        "start": start,
        "end": end,
        "length": _span(length),
        "ticks": ticks,
        "total": len(all_rows),
        "width": WATERFALL_WIDTH,
        "root_completer": root_completer,
    }


# --- Endpoints -----------------------------------------------------------------------------------


def endpoint_rows(*, user) -> list[Endpoint]:
    """All endpoints (everyone sees endpoints) with their lock, queued count
    and open case (when the user may see it). Endpoints are configuration
    (few rows); the queued count reads the partial index of queued tickets,
    one grouped query for all endpoints."""
    endpoints = list(Endpoint.objects.select_related("lock").order_by("address"))
    queued = dict(
        Ticket.objects.filter(state=TicketState.QUEUED)
        .values_list("endpoint_id")
        .annotate(n=Count("id"))
        .values_list("endpoint_id", "n")
    )
    open_cases = dict(
        visible_cases(user).filter(state=CaseState.OPEN).values_list("endpoint_id", "id")
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


def recent_turns(endpoint: Endpoint, *, user, limit: int = 20) -> list[Turn]:
    """The endpoint's newest turns whose tickets the user may see (all of
    them for its owners and staff). turn_seq_unique (endpoint, seq) serves
    the newest-first read."""
    turns = Turn.objects.filter(endpoint_id=endpoint.id)
    owned = owned_endpoint_ids(user)
    if owned is not None and endpoint.id not in owned:
        turns = turns.filter(ticket__in=visible_tickets(user))
    return list(turns.select_related("ticket").order_by("-seq")[:limit])


HOUR_TURN_CAP = 5000


def uuid7_floor(moment: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond (core.ids.new_id)."""
    return uuid.UUID(int=int(moment.timestamp() * 1000) << 80)


_OUTCOME_TONE = {"completed": "ok", "failed": "bad", "uncertain": "bad", "stopped": "other"}


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def endpoint_hour(endpoint: Endpoint, span: str = "1h") -> dict[str, Any]:
    """The range's turns of an endpoint (the last hour by default; the
    chart ranges) by outcome, and p50/p95 run time of those that ended on
    evidence (completed, failed, stopped), as bars for a server-drawn SVG.
    Turn ids are UUIDv7 (a turn's id is its start time), so the range is a
    primary key range, not a scan of the endpoint's history; capped."""
    from console.templatetags.consoletags import ENDED_ON_EVIDENCE, _span  # noqa: PLC0415

    span = chart_range(span)
    since = timezone.now() - CHART_RANGES[span][0]
    turns = list(
        Turn.objects.filter(endpoint_id=endpoint.id, id__gte=uuid7_floor(since))
        .order_by("-id")
        .values_list("state", "started_at", "ended_at")[: HOUR_TURN_CAP + 1]
    )
    capped = len(turns) > HOUR_TURN_CAP
    turns = turns[:HOUR_TURN_CAP]
    by_state: dict[str, int] = {}
    runs = []
    for state, started, ended in turns:
        by_state[state] = by_state.get(state, 0) + 1
        # Only turns that ended on evidence: an uncertain turn has no end,
        # and an unresolved one's ended_at is the owner's decision.
        if state in ENDED_ON_EVIDENCE and ended and started:
            runs.append((ended - started).total_seconds())
    runs.sort()
    biggest = max(by_state.values(), default=1)
    bars = [
        {
            "label": state.replace("_", " "),
            "count": n,
            "tone": _OUTCOME_TONE.get(state, "in"),
            "y": 4 + 20 * i,
            "width": max(2, round(260 * n / biggest)),
        }
        for i, (state, n) in enumerate(sorted(by_state.items()))
    ]
    p50, p95 = _pct(runs, 0.5), _pct(runs, 0.95)
    return {
        "range": span,
        "total": len(turns),
        "capped": capped,
        "bars": bars,
        "height": 8 + 20 * len(bars),
        "p50": _span(p50) if p50 is not None else "—",
        "p95": _span(p95) if p95 is not None else "—",
        "measured": len(runs),
    }


def endpoint_cases(endpoint: Endpoint, *, user, limit: int = 10) -> list[RecoveryCase]:
    return list(visible_cases(user).filter(endpoint_id=endpoint.id).order_by("-opened_at")[:limit])


# --- Recovery ------------------------------------------------------------------------------------
# Case and lesson lists come from recovery.selectors; what is here draws one case.


@dataclass
class CaseDetail:
    case: RecoveryCase
    evidence: list[CaseEvidence]
    inspections: list[Inspection]
    decisions: list[Decision]
    lesson: Lesson | None
    # The uncertain turn's tool receipts, paired by call (agent runners).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def get_case(case_id: uuid.UUID, *, user) -> RecoveryCase:
    """A case the user may see (its endpoint's owners, staff); 404 otherwise."""
    case = (
        visible_cases(user).select_related("endpoint", "ticket", "turn").filter(id=case_id).first()
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
        tool_calls=tool_calls(case.ticket_id, turn_id=case.turn_id),
    )


def case_inspections(case_id: uuid.UUID):
    """The inspections a decision on this case may rest on (form choices)."""
    return Inspection.objects.filter(case_id=case_id).order_by("-created_at")


def rerun_warning(case: RecoveryCase) -> dict[str, Any] | None:
    """When the case's turn was quarantined for overrunning its budget, what
    a re-run with the same input and budget repeats: that budget, and the
    last outcome of that input on the endpoint (its newest ticket with the
    same input hash). The case's own ticket matches, so the newest-first
    walk of the endpoint's tickets stops at or before it: bounded by the
    tickets admitted since."""
    turn = case.turn
    if turn is None or turn.interrupt_reason != "deadline":
        return None
    ticket = case.ticket
    last = (
        Ticket.objects.filter(
            endpoint_id=case.endpoint_id, input_sha256=ticket.input_sha256, id__gte=ticket.id
        )
        .select_related("turn")
        .order_by("-id")
        .first()
    )
    return {
        "seq": turn.seq,
        "budget_s": round((turn.deadline_at - turn.started_at).total_seconds()),
        "input": ticket.input,
        "last": last,
        "last_turn": last.turn if last is not None and last.turn_id else None,
    }
