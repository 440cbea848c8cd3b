"""A trace's page: its lineage as an indented tree (only the tickets the
user may see, from ``tickets.selectors.lineage``; 404 when that is none),
each row's kind, open case and the breaker's warning, and the waterfall of
the tickets' queued, running and waiting spans on one time axis."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from console.templatetags.consoletags import ENDED_ON_EVIDENCE, _span
from recovery.models import CaseState
from recovery.selectors import visible_cases
from tickets import selectors as ticket_selectors
from tickets.models import Ticket, TicketEvent, TicketState, Trace
from tickets.selectors import visible_tickets


def trace_page(trace_id: str, *, user) -> dict[str, Any]:
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    tree, rows = trace_tree(trace_id, user=user)
    return {
        "trace_id": trace_id,
        "tree": tree,
        "rows": rows,
        "active": trace_active(rows),
        "waterfall": trace_waterfall(rows),
        "warned": any(r.warned for r in rows),
        "trace_soft_limit": settings.TRACE_SOFT_LIMIT,
        "trace_hard_limit": settings.TRACE_HARD_LIMIT,
        "budget": trace_budget(trace_id),
        "live_token": live_token,
    }


def trace_budget(trace_id: str) -> dict[str, Any] | None:
    """The trace's budget and what its agent turns spent against it (read
    after ``trace_tree``, which answers 404 to a user who may see none of
    its tickets); None when the trace has no budget."""
    row = (
        Trace.objects.filter(id=trace_id, budget__isnull=False)
        .values(
            "budget",
            "spent_tokens",
            "spent_cost",
            "created_at",
            "budget_warned_at",
            "exhausted_at",
            "exhausted_reason",
        )
        .first()
    )
    if row is None:
        return None
    budget = row["budget"]
    lines = []
    for key, spent in (("tokens", row["spent_tokens"]), ("cost", row["spent_cost"])):
        if budget.get(key) is not None:
            limit = budget[key]
            lines.append(
                {
                    "name": key,
                    "spent": spent,
                    "limit": limit,
                    "percent": min(100, round(100 * float(spent) / float(limit))),
                }
            )
    if budget.get("wall_s") is not None:
        end = row["exhausted_at"] or timezone.now()
        used = (end - row["created_at"]).total_seconds()
        lines.append(
            {
                "name": "wall_s",
                "spent": round(used, 1),
                "limit": budget["wall_s"],
                "percent": min(100, round(100 * used / budget["wall_s"])),
            }
        )
    return {
        "lines": lines,
        "warned_at": row["budget_warned_at"],
        "exhausted_at": row["exhausted_at"],
        "exhausted_reason": row["exhausted_reason"],
    }


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
