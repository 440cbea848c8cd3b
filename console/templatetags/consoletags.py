"""Small filters the console's templates repeat on every page."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()

NONE = mark_safe('<span class="muted">—</span>')  # noqa: S308 - a constant

# Every state the console shows, by tone. The badge carries the state's name
# as text as well as a colour, so it reads without colour too.
TONES = {
    "ok": {
        "succeeded",
        "completed",
        "available",
        "delivered",
        "recorded",
        "closed",
        "stopped",
        "consuming",
    },
    "active": {"running", "accepted", "attempted", "pending", "interrupting", "waiting"},
    "idle": {"queued", "none", "cancelled", "decided"},
    "warn": {
        "awaiting_approval",
        "open",
        "recovering",
        "overdue",
        "unresolved",
        "orphaned",
        "paused",
        "not_consuming",
    },
    "bad": {"failed", "quarantined", "uncertain"},
}
_TONE_OF = {state: tone for tone, states in TONES.items() for state in states}


@register.filter
def badge(state: Any) -> str:
    state = "" if state is None else str(state)
    tone = _TONE_OF.get(state, "idle")
    return format_html(
        '<span class="badge tone-{}">{}</span>', tone, state.replace("_", " ") or "—"
    )


@register.filter
def shortid(value: Any, length: int = 8) -> str:
    """A monospace id cut short, the full id in the title.

    Ids here are UUIDv7: the leading characters are a millisecond timestamp,
    the same for everything created within a minute, so the short form shows
    the random tail instead (``…36ada1f2``). Other values (hashes, addresses)
    keep their head."""
    if value in (None, ""):
        return NONE
    full = str(value)
    if len(full) <= length + 1:
        short = full
    elif _is_uuid(full):
        short = "…" + full[-length:]
    else:
        short = full[:length] + "…"
    return format_html('<code class="id" title="{}">{}</code>', full, short)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


@register.filter
def utc(value: Any) -> str:
    """A timestamp in UTC, to the second; the ISO form in the title."""
    if not value:
        return NONE
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    value = value.astimezone(UTC) if timezone.is_aware(value) else value
    iso = value.isoformat().replace("+00:00", "Z")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', iso, iso, value.strftime("%Y-%m-%d %H:%M:%SZ")
    )


@register.filter
def compact_json(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


@register.filter
def change_value(value: Any) -> str:
    """A value in a diff of generations: a whole float as the integer it
    is (a budget stored as 20 and proposed as 12.0 reads "20 -> 12"), the
    rest as ``compact_json``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return compact_json(value)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def seconds(value: Any) -> str:
    """Budget seconds without float noise: 300.0 -> '300 s', 0.05 -> '0.05 s'."""
    if value is None:
        return "—"
    return f"{float(value):g} s"


@register.filter
def indent(level: Any) -> str:
    """A tree row's depth as spacer elements (no inline style: the CSP forbids it)."""
    try:
        count = max(0, min(int(level), 64))
    except (TypeError, ValueError):
        count = 0
    return mark_safe('<span class="indent" aria-hidden="true"></span>' * count)  # noqa: S308


@register.simple_tag
def poll_every(seconds: int) -> str:
    """The ``hx-trigger`` of a live region: ``every Ns``. The optional
    ``CONSOLE_REFRESH_S`` setting overrides every page's period (the browser
    tests shorten it); console.js skips a poll while refresh is paused."""
    return f"every {_refresh_s(seconds)}s"


def _refresh_s(seconds: int) -> int:
    """A live region's timer, or ``CONSOLE_REFRESH_S`` where it is set."""
    from django.conf import settings  # noqa: PLC0415

    return getattr(settings, "CONSOLE_REFRESH_S", None) or seconds


# A live region refreshes on a timer this slow even while it watches: for
# what no ticket event marks (an obligation falling overdue, a heartbeat).
LIVE_SAFETY_S = 60


@register.simple_tag(takes_context=True)
def live(context, period: int, ticket=None, min_s: int = 1) -> str:
    """The attributes of a live region (console/views/live.py): it refreshes when
    a watch says the ticket (or, without ``ticket``, the ledger) changed
    since ``live_token`` in the context, at most every ``min_s`` seconds;
    polls every ``period`` seconds where watching is unavailable; and
    refreshes every ``LIVE_SAFETY_S`` regardless. ``CONSOLE_REFRESH_S``
    overrides both timers (the browser tests shorten them)."""
    from django.urls import reverse  # noqa: PLC0415
    from django.utils.http import urlencode  # noqa: PLC0415

    url = reverse("live_watch") + (f"?{urlencode({'ticket': ticket})}" if ticket else "")
    return format_html(
        'hx-trigger="claimcheck:changed, {}" data-live-watch="{}" data-live-token="{}"'
        ' data-live-period="{}" data-live-min="{}"',
        poll_every(LIVE_SAFETY_S),
        url,
        context.get("live_token", ""),
        _refresh_s(period),
        min_s,
    )


_ISO_IN_TEXT = re.compile(
    r"\b(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.\d+)?(Z|[+-]\d{2}:\d{2})?"
)


@register.filter
def utc_text(value: Any) -> str:
    """Free text (a quarantine reason, a note) with every ISO timestamp in it
    printed as the console prints times: ``YYYY-MM-DD HH:MM:SSZ`` in UTC."""
    if value in (None, ""):
        return ""

    def one(match: re.Match) -> str:
        try:
            moment = datetime.fromisoformat(match.group(0).replace("Z", "+00:00"))
        except ValueError:
            return match.group(0)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")

    return _ISO_IN_TEXT.sub(one, str(value))


@register.filter
def idtail(value: Any) -> str:
    """Plain text of an id as ``shortid`` prints it (``…36ada1f2``), for
    titles and sentences; the search box finds a ticket by it."""
    full = "" if value is None else str(value)
    return "…" + full[-8:] if _is_uuid(full) and len(full) > 9 else full


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


@register.simple_tag
def duration(start: Any, end: Any = None, *, live: str = "so far") -> str:
    """How long from ``start`` to ``end``; with no end yet, until now and
    marked ``so far``. Empty start: a dash."""
    if not start:
        return NONE
    until = end or timezone.now()
    text = _span(max(0.0, (until - start).total_seconds()))
    if end is None:
        return format_html('{} <span class="muted">{}</span>', text, live)
    return text


# The turn states whose ended_at is when the turn ended, on evidence. An
# unresolved turn's ended_at is when an owner closed it without evidence
# (nobody knows when, or whether, it ended); an uncertain one has none.
ENDED_ON_EVIDENCE = frozenset({"completed", "failed", "stopped"})
_UNKNOWN_DECIDED = mark_safe('<span class="muted">unknown (closed by a decision)</span>')  # noqa: S308
_UNKNOWN_UNCERTAIN = mark_safe('<span class="muted">unknown (no stop evidence)</span>')  # noqa: S308


@register.simple_tag
def turn_end(turn: Any) -> str:
    """A turn's end time, only when it is known to have ended."""
    if turn is None:
        return NONE
    if turn.state in ENDED_ON_EVIDENCE:
        return utc(turn.ended_at)
    if turn.state == "unresolved":
        return _UNKNOWN_DECIDED
    if turn.state == "uncertain":
        return _UNKNOWN_UNCERTAIN
    return NONE


@register.simple_tag
def turn_run_time(turn: Any) -> str:
    """A turn's run time: to its end when it ended on evidence, so far while
    it runs, and not at all when its end is unknown."""
    if turn is None:
        return NONE
    if turn.state in ENDED_ON_EVIDENCE:
        return duration(turn.started_at, turn.ended_at)
    if turn.state in ("running", "interrupting"):
        return duration(turn.started_at)
    return format_html(
        '<span class="muted">at least {}</span>',
        duration(turn.started_at, turn.ended_at or timezone.now()),
    )
