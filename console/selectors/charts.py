"""The charts the dashboard and an endpoint's page draw on the server
(SVG geometry and the same figures as table rows): tickets admitted and
finished per bucket (``last_hour``), an endpoint's turns by outcome and run
time (``endpoint_hour``). Both read a primary-key range of UUIDv7 ids, never
older rows."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from console.templatetags.consoletags import ENDED_ON_EVIDENCE, _span
from endpoints.models import Endpoint
from tickets.models import TicketState, Turn
from tickets.selectors import visible_tickets

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
