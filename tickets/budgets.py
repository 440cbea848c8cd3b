"""A trace's budget: what its root's submitter allows the whole chain of
agents to spend (tokens, cost, wall-clock), what its agent turns spent, and
the breaker that closes the trace once the hard limit is crossed
(docs/howto/trace-budgets.md).

Where it is enforced: the trace row carries ``budget``, ``spent_tokens``,
``spent_cost`` and ``exhausted_at``. ``charge`` adds one turn's usage with
one conditional ``UPDATE ... SET spent = spent + x`` (concurrent finishes
lose nothing: each increments under the row lock) and, in the same
statement, sets ``exhausted_at`` when the new totals reach a hard limit.
``claimcheck_admit`` reads ``exhausted_at`` (and the wall-clock budget
against the root's admission time) under the same row lock, ``FOR UPDATE``,
before it inserts a ticket in the trace: an admission racing the charge
that exhausts the trace either commits first (and is counted as admitted
before the limit) or waits for the charge's commit and is refused. No new
parameter of the function: its signature is the contract of a rolling
upgrade (core/sqlfunctions.py).

The interrupt of the trace's running turns is the runtime's
(runtime/turns/budgets.py, ``interrupt_trace``): this module only says
which trace crossed its limit.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.errors import Invalid

from . import lifecycle
from .models import Ticket, Trace

log = logging.getLogger(__name__)

BUDGET_KEYS = ("tokens", "cost", "wall_s")


def validate_budget(budget: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{tokens?, cost?, wall_s?}``, each a positive number (tokens an
    integer), at least one given; None stays None."""
    if budget is None:
        return None
    if not isinstance(budget, dict):
        raise Invalid("budget must be an object {tokens?, cost?, wall_s?}")
    unknown = set(budget) - set(BUDGET_KEYS)
    if unknown:
        raise Invalid(f"budget has unknown keys: {', '.join(sorted(unknown))}")
    clean: dict[str, Any] = {}
    for key in BUDGET_KEYS:
        value = budget.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise Invalid(f"budget.{key} must be a positive number")
        if key == "tokens" and not isinstance(value, int):
            raise Invalid("budget.tokens must be a positive integer")
        if value > 10**15:
            raise Invalid(f"budget.{key} is too large")
        clean[key] = value
    if not clean:
        raise Invalid("budget names none of tokens, cost, wall_s")
    return clean


# A root that opened its trace alone wrote no trace row (claimcheck_admit_v2):
# its budget starts the row, counting it (claimcheck_trace_opener), from its
# admission (the wall-clock budget's start). Nothing when the trace has a
# row (a trace named by the caller): then the row's own update, below.
_OPEN_SQL = """
INSERT INTO tickets_trace (id, tickets, parties, max_depth, flagged, created_at, budget)
SELECT %(trace)s, 1, jsonb_build_object(o.o_party, 1), 0, false, o.o_created_at, %(budget)s::jsonb
FROM claimcheck_trace_opener(p_trace => %(trace)s) o
WHERE o.o_ticket = %(ticket)s
ON CONFLICT (id) DO NOTHING
"""


def open_budget(*, trace_id: str, ticket_id: Any, budget: dict[str, Any]) -> None:
    """Set the budget of the trace a root ticket has just opened, in the
    admission's transaction (the caller's ``atomic``: refused, nothing was
    admitted). Only the ticket that opened the trace sets it: a root that
    joins a trace others already spend in may not change its budget."""
    with connection.cursor() as cur:
        cur.execute(
            _OPEN_SQL, {"trace": trace_id, "ticket": ticket_id, "budget": json.dumps(budget)}
        )
        opened = cur.rowcount
    updated = opened or Trace.objects.filter(id=trace_id, tickets=1, budget__isnull=True).update(
        budget=budget
    )
    if not updated:
        raise Invalid(
            "budget is set by the ticket that opens its trace; this trace already has tickets"
        )
    lifecycle.append_event(
        ticket_id=ticket_id, kind="trace_budget_set", actor="budget", detail={"budget": budget}
    )


def prices() -> dict[str, dict[str, float]]:
    """``MODEL_PRICES``: model name -> ``{input, output}`` per million tokens."""
    return settings.MODEL_PRICES


def cost_of(usage: dict[str, Any]) -> Decimal:
    """What one turn's usage cost, from the model's price (per million input
    and output tokens); a model without a price costs nothing here (its
    tokens still count)."""
    price = prices().get(str(usage.get("model") or ""))
    if not price:
        return Decimal(0)
    per_m = Decimal(1_000_000)
    return (
        Decimal(str(price.get("input", 0))) * _int(usage.get("input_tokens"))
        + Decimal(str(price.get("output", 0))) * _int(usage.get("output_tokens"))
    ) / per_m


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Charged:
    trace_id: str
    spent_tokens: int
    spent_cost: Decimal
    warned: bool  # this charge crossed the soft limit
    exhausted: str  # this charge crossed a hard limit: which ("tokens", "cost"); else ""


# The row locked first (its latest version: the statement after it takes a
# new snapshot, READ COMMITTED), so the increment reads every committed
# charge and the crossing is told from the values before it. Only traces
# with a budget are written: a trace without one costs no write per turn.
_LOCK_SQL = """
SELECT budget_warned_at IS NULL, exhausted_at IS NULL FROM tickets_trace
WHERE id = %(trace)s AND budget IS NOT NULL FOR UPDATE
"""
_CHARGE_SQL = """
UPDATE tickets_trace tr SET
    spent_tokens = tr.spent_tokens + %(tokens)s,
    spent_cost = tr.spent_cost + %(cost)s,
    budget_warned_at = COALESCE(tr.budget_warned_at, CASE
        WHEN tr.spent_tokens + %(tokens)s >= (tr.budget ->> 'tokens')::numeric * %(soft)s
          OR tr.spent_cost + %(cost)s >= (tr.budget ->> 'cost')::numeric * %(soft)s
        THEN now() END),
    exhausted_at = COALESCE(tr.exhausted_at, CASE
        WHEN tr.spent_tokens + %(tokens)s >= (tr.budget ->> 'tokens')::numeric
          OR tr.spent_cost + %(cost)s >= (tr.budget ->> 'cost')::numeric
        THEN now() END),
    exhausted_reason = CASE WHEN tr.exhausted_at IS NOT NULL THEN tr.exhausted_reason
        WHEN tr.spent_tokens + %(tokens)s >= (tr.budget ->> 'tokens')::numeric THEN 'tokens'
        WHEN tr.spent_cost + %(cost)s >= (tr.budget ->> 'cost')::numeric THEN 'cost'
        ELSE '' END
WHERE tr.id = %(trace)s
RETURNING tr.spent_tokens, tr.spent_cost, tr.budget_warned_at IS NOT NULL,
    tr.exhausted_reason, tr.budget
"""


def charge(*, trace_id: str, ticket_id: Any, turn_id: Any, usage: dict[str, Any]) -> Charged | None:
    """Count one agent turn's usage against its trace (tokens = input +
    output; cost from ``MODEL_PRICES``). Crossing the soft limit
    (``TRACE_BUDGET_SOFT_RATIO`` of a hard one) records ``trace_budget_warning``
    once; crossing a hard one sets the trace exhausted and records
    ``trace_budget_exhausted`` once, on the ticket whose turn crossed it.
    None: the trace has no budget. Runs in the caller's transaction (the
    usage event's): the event and its count commit together."""
    tokens = _int(usage.get("input_tokens")) + _int(usage.get("output_tokens"))
    cost = cost_of(usage)
    params = {
        "trace": trace_id,
        "tokens": tokens,
        "cost": cost,
        "soft": Decimal(str(settings.TRACE_BUDGET_SOFT_RATIO)),
    }
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_LOCK_SQL, params)
        before = cur.fetchone()
        if before is None:
            return None
        not_warned, not_exhausted = before
        cur.execute(_CHARGE_SQL, params)
        spent_tokens, spent_cost, warned_now, reason, budget = cur.fetchone()
        warned = not_warned and warned_now
        exhausted = reason if not_exhausted and reason else ""
        if isinstance(budget, str):
            budget = json.loads(budget)
        detail = {
            "trace_id": trace_id,
            "budget": budget,
            "spent": {"tokens": spent_tokens, "cost": str(spent_cost)},
        }
        if warned:
            lifecycle.append_event(
                ticket_id=ticket_id,
                kind="trace_budget_warning",
                actor="budget",
                turn_id=turn_id,
                detail={**detail, "soft_ratio": settings.TRACE_BUDGET_SOFT_RATIO},
            )
        if exhausted:
            lifecycle.append_event(
                ticket_id=ticket_id,
                kind="trace_budget_exhausted",
                actor="budget",
                turn_id=turn_id,
                detail={**detail, "limit": exhausted},
            )
            log.warning("trace %s spent its %s budget: its breaker opens", trace_id, exhausted)
    return Charged(
        trace_id=trace_id,
        spent_tokens=spent_tokens,
        spent_cost=spent_cost,
        warned=bool(warned),
        exhausted=exhausted or "",
    )


# Traces past their wall-clock budget, closed once (the ``IS NULL`` guard,
# re-checked under the row lock against a charge closing it at once). The
# partial index ``trace_budget_open`` holds only budgeted, open traces.
_EXPIRE_SQL = """
UPDATE tickets_trace SET exhausted_at = now(), exhausted_reason = 'wall_s'
WHERE budget IS NOT NULL AND exhausted_at IS NULL AND budget ->> 'wall_s' IS NOT NULL
  AND created_at + make_interval(secs => (budget ->> 'wall_s')::float8) <= now()
RETURNING id, budget, spent_tokens, spent_cost
"""


def expire_wall_budgets() -> list[str]:
    """Close every trace past its wall-clock budget (admission already
    refuses them by the clock; this records it, once, with a
    ``trace_budget_exhausted`` event on the trace's root, so the runtime
    interrupts what still runs). Returns the traces closed now."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(_EXPIRE_SQL)
        rows = cur.fetchall()
        for trace_id, budget, spent_tokens, spent_cost in rows:
            root = (
                Ticket.objects.filter(trace_id=trace_id)
                .order_by("created_at", "id")
                .values_list("id", flat=True)
                .first()
            )
            if root is None:
                continue
            lifecycle.append_event(
                ticket_id=root,
                kind="trace_budget_exhausted",
                actor="budget",
                detail={
                    "trace_id": trace_id,
                    "budget": json.loads(budget) if isinstance(budget, str) else budget,
                    "spent": {"tokens": spent_tokens, "cost": str(spent_cost)},
                    "limit": "wall_s",
                },
            )
            log.warning("trace %s is past its wall-clock budget: its breaker opens", trace_id)
    return [row[0] for row in rows]


def exhausted_of(trace_ids: set[str]) -> set[str]:
    """Which of these traces are closed (spent, or past their clock)."""
    return set(
        Trace.objects.filter(id__in=trace_ids, exhausted_at__isnull=False).values_list(
            "id", flat=True
        )
    )
