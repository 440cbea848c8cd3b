"""Retention: delete finished work older than a cutoff, in batches, through
one privileged, narrow path.

The unit is a trace (every ticket of a lineage shares its trace: children
inherit it, callbacks and re-runs carry it). A trace is pruned whole, with
its tickets' events, turns, context entries, callbacks, deliveries and
delivery attempts, only when every one of its tickets:

1. is terminal (succeeded, failed, cancelled, orphaned) and finished before
   the cutoff, with no open obligation and no pending callback, and no
   delivery still due;
2. is not referenced by any recovery case (its ticket or its turn) nor is
   any decision's re-run: a case's evidence, inspections, decisions and
   lesson are never deleted, and neither is anything they point at;
3. has no turn still active or holding an endpoint's lock, and no context
   entry among its endpoint's most recent ``HISTORY_ENTRIES`` (the history
   the next turn is given);
4. has no link (parent, re-run, callback, completing turn) to a ticket of
   another trace, in either direction.

The deletion happens in ``claimcheck_prune_ledger``, a SECURITY DEFINER
function created by migration ``tickets.0001_initial`` and owned by the
owner role. The application role may EXECUTE it and nothing more: it still
has no DELETE or TRUNCATE on the append-only tables (events, delivery
attempts), whose triggers stay enabled and let a DELETE through only inside
that function (core/append_only.py). The function re-checks the rule
itself; the caller chooses only the cutoff (at least a day ago) and the batch
size.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection
from django.utils import timezone

log = logging.getLogger(__name__)

# runtime.turns.HISTORY_ENTRIES: the context entries a turn is given.
KEEP_HISTORY = 20
# A pause longer than ten times the batch is a prune that does not run.
MAX_PAUSE_RATIO = 10.0

COUNTS = (
    "traces",
    "tickets",
    "events",
    "turns",
    "context_entries",
    "callbacks",
    "deliveries",
    "attempts",
)


def function_sql(schema: str) -> str:
    """The function, for the migration (``schema``: where the tables live;
    the function's search_path is pinned to it)."""
    return f"""
CREATE OR REPLACE FUNCTION claimcheck_prune_ledger(
    cutoff timestamptz, max_traces integer, dry_run boolean, keep_history integer
) RETURNS TABLE (
    traces bigint, tickets bigint, events bigint, turns bigint, context_entries bigint,
    callbacks bigint, deliveries bigint, attempts bigint
)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, {schema}, pg_temp
AS $fn$
DECLARE
    trace_ids varchar[];
    ticket_ids uuid[];
    turn_ids uuid[];
    delivery_ids uuid[];
BEGIN
    IF cutoff IS NULL OR cutoff > pg_catalog.now() - interval '1 day' THEN
        RAISE EXCEPTION 'prune: the cutoff must be at least one day ago'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_traces IS NULL OR max_traces < 1 THEN
        RAISE EXCEPTION 'prune: max_traces must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF keep_history IS NULL OR keep_history < 1 THEN
        RAISE EXCEPTION 'prune: keep_history must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The candidates, one trace at a time: the rule is a subplan per trace
    -- (OFFSET 0 keeps the planner from turning it into an anti-join over
    -- the whole ticket table), so a batch reads the tickets of the traces
    -- it looks at and stops at max_traces. Each candidate's row is locked; a trace an admission is
    -- joining right now (it holds the row: the trace's count) is skipped.
    SELECT coalesce(array_agg(c.id), '{{}}') INTO trace_ids FROM (
        SELECT tr.id FROM tickets_trace tr
         WHERE tr.created_at < cutoff
           AND NOT EXISTS (
               SELECT 1 FROM tickets_ticket t
                WHERE t.trace_id = tr.id
                  AND (
                      -- 1. finished before the cutoff, nothing still owed
                      t.state NOT IN ('succeeded', 'failed', 'cancelled', 'orphaned')
                      OR t.finished_at IS NULL OR t.finished_at >= cutoff
                      OR t.obligation_state = 'open'
                      OR t.callback_state = 'pending'
                      OR EXISTS (SELECT 1 FROM tickets_delivery d
                                  WHERE d.ticket_id = t.id AND d.next_attempt_at IS NOT NULL)
                      -- 2. anything a recovery case points at
                      OR EXISTS (SELECT 1 FROM recovery_recoverycase c WHERE c.ticket_id = t.id)
                      OR EXISTS (SELECT 1 FROM recovery_recoverycase c
                                   JOIN runtime_turn u ON u.id = c.turn_id
                                  WHERE u.ticket_id = t.id)
                      OR EXISTS (SELECT 1 FROM recovery_decision x WHERE x.rerun_ticket_id = t.id)
                      -- 3. a live turn, a held lock, recent history
                      OR EXISTS (SELECT 1 FROM runtime_turn u
                                  WHERE u.ticket_id = t.id
                                    AND u.state IN ('running', 'interrupting'))
                      OR EXISTS (SELECT 1 FROM runtime_endpointlock l
                                   JOIN runtime_turn u ON u.id = l.holder_id
                                  WHERE u.ticket_id = t.id)
                      OR EXISTS (
                          SELECT 1 FROM runtime_contextentry ce
                           WHERE ce.ticket_id = t.id
                             AND ce.seq >= coalesce((
                                 SELECT c2.seq FROM runtime_contextentry c2
                                  WHERE c2.endpoint_id = ce.endpoint_id
                                  ORDER BY c2.seq DESC OFFSET keep_history - 1 LIMIT 1), 0))
                      -- 4. links to another trace, either way
                      OR EXISTS (SELECT 1 FROM tickets_ticket y
                                  WHERE y.id IN (t.parent_id, t.rerun_of_id, t.callback_for_id)
                                    AND y.trace_id <> tr.id)
                      OR EXISTS (SELECT 1 FROM tickets_ticket x
                                  WHERE (x.parent_id = t.id OR x.rerun_of_id = t.id
                                         OR x.callback_for_id = t.id)
                                    AND x.trace_id <> tr.id)
                      OR EXISTS (SELECT 1 FROM runtime_turn u
                                   JOIN tickets_ticket y ON y.id = u.ticket_id
                                  WHERE u.id = t.completed_by_turn_id AND y.trace_id <> tr.id)
                  )
                OFFSET 0
           )
         LIMIT max_traces
         FOR UPDATE SKIP LOCKED
    ) c;
    -- A ticket that joined a candidate after this statement's snapshot and
    -- before its lock (it committed in between) is not terminal: its trace
    -- stays.
    trace_ids := ARRAY(
        SELECT x FROM pg_catalog.unnest(trace_ids) x
         WHERE NOT EXISTS (
             SELECT 1 FROM tickets_ticket t
              WHERE t.trace_id = x
                AND (t.state NOT IN ('succeeded', 'failed', 'cancelled', 'orphaned')
                     OR t.finished_at IS NULL OR t.finished_at >= cutoff)));

    SELECT coalesce(array_agg(t.id), '{{}}') INTO ticket_ids
      FROM tickets_ticket t WHERE t.trace_id = ANY(trace_ids);
    SELECT coalesce(array_agg(u.id), '{{}}') INTO turn_ids
      FROM runtime_turn u WHERE u.ticket_id = ANY(ticket_ids);
    SELECT coalesce(array_agg(d.id), '{{}}') INTO delivery_ids
      FROM tickets_delivery d WHERE d.ticket_id = ANY(ticket_ids);

    traces := pg_catalog.cardinality(trace_ids);
    tickets := pg_catalog.cardinality(ticket_ids);
    turns := pg_catalog.cardinality(turn_ids);
    deliveries := pg_catalog.cardinality(delivery_ids);
    IF dry_run THEN
        SELECT count(*) INTO events FROM tickets_ticketevent e WHERE e.ticket_id = ANY(ticket_ids);
        SELECT count(*) INTO context_entries FROM runtime_contextentry ce
         WHERE ce.ticket_id = ANY(ticket_ids) OR ce.turn_id = ANY(turn_ids);
        SELECT count(*) INTO callbacks FROM tickets_callback cb
         WHERE cb.source_id = ANY(ticket_ids) OR cb.ticket_id = ANY(ticket_ids);
        SELECT count(*) INTO attempts FROM tickets_deliveryattempt a
         WHERE a.delivery_id = ANY(delivery_ids);
        RETURN NEXT;
        RETURN;
    END IF;

    -- The append-only triggers let these DELETEs through: this transaction,
    -- this function's owner (core/append_only.py).
    PERFORM pg_catalog.set_config('claimcheck.pruning', 'on', true);
    DELETE FROM tickets_deliveryattempt a WHERE a.delivery_id = ANY(delivery_ids);
    GET DIAGNOSTICS attempts = ROW_COUNT;
    DELETE FROM tickets_delivery d WHERE d.id = ANY(delivery_ids);
    DELETE FROM tickets_callback cb
     WHERE cb.source_id = ANY(ticket_ids) OR cb.ticket_id = ANY(ticket_ids);
    GET DIAGNOSTICS callbacks = ROW_COUNT;
    DELETE FROM tickets_ticketevent e WHERE e.ticket_id = ANY(ticket_ids);
    GET DIAGNOSTICS events = ROW_COUNT;
    DELETE FROM runtime_contextentry ce
     WHERE ce.ticket_id = ANY(ticket_ids) OR ce.turn_id = ANY(turn_ids);
    GET DIAGNOSTICS context_entries = ROW_COUNT;
    -- Tickets and turns point at each other; the foreign keys are checked
    -- at commit (DEFERRABLE INITIALLY DEFERRED), when both are gone.
    DELETE FROM tickets_ticket t WHERE t.id = ANY(ticket_ids);
    DELETE FROM runtime_turn u WHERE u.id = ANY(turn_ids);
    DELETE FROM tickets_trace tr WHERE tr.id = ANY(trace_ids);
    PERFORM pg_catalog.set_config('claimcheck.pruning', 'off', true);
    RETURN NEXT;
END;
$fn$;
REVOKE ALL ON FUNCTION claimcheck_prune_ledger(timestamptz, integer, boolean, integer) FROM PUBLIC;
"""


DROP_SQL = (
    "DROP FUNCTION IF EXISTS claimcheck_prune_ledger(timestamptz, integer, boolean, integer);"
)


@dataclass
class PruneReport:
    cutoff: str
    dry_run: bool
    batches: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    # Every batch's seconds inside the function (its transaction), and the
    # seconds paused between batches (``pause_ratio``).
    batch_s: list[float] = field(default_factory=list)
    paused_s: float = 0.0
    # False when ``max_s`` or ``stop`` ended the run, candidates perhaps left.
    complete: bool = True


def prune(
    *,
    older_than_days: float,
    batch: int = 500,
    dry_run: bool = False,
    keep_history: int = KEEP_HISTORY,
    pause_ratio: float = 0.0,
    max_s: float | None = None,
    stop: threading.Event | None = None,
) -> PruneReport:
    """Prune traces finished more than ``older_than_days`` ago, ``batch``
    traces per transaction, until a batch finds nothing (module docstring).
    ``dry_run`` counts what one pass would delete (every candidate, not one
    batch) and deletes nothing.

    ``pause_ratio`` yields to the rest of the database between batches: after
    a batch of ``t`` seconds, wait ``pause_ratio * t`` (0.5: the prune holds
    the database at most two thirds of the time, as gh-ost's nice ratio).
    Every commit on the primary flushes the WAL written before its own
    commit record, a batch's deletions included, so an admission's commit
    waits behind whatever the prune wrote since the last flush; the pause
    bounds that (docs/howto/operations.md, Retention). ``max_s`` ends the run after
    the batch that passes it, and ``stop`` (set by another thread) after the
    current batch, with ``complete`` False; the next run goes on from there."""
    if older_than_days < 1:
        raise ValueError("--older-than must be at least 1 day")
    if batch < 1:
        raise ValueError("--batch must be positive")
    if not 0 <= pause_ratio <= MAX_PAUSE_RATIO:
        raise ValueError(f"--pause-ratio must be between 0 and {MAX_PAUSE_RATIO:g}")
    if max_s is not None and not max_s >= 0:
        raise ValueError("--max-seconds must be 0 or more")
    cutoff = timezone.now() - timedelta(days=older_than_days)
    report = PruneReport(cutoff=cutoff.isoformat(), dry_run=dry_run)
    stop = stop or threading.Event()
    started = time.monotonic()
    while True:
        batch_started = time.monotonic()
        with connection.cursor() as cur:
            # Autocommit: each call is its own transaction; a batch holds its
            # row locks only for itself.
            cur.execute(
                "SELECT * FROM claimcheck_prune_ledger("
                "cutoff => %s, max_traces => %s, dry_run => %s, keep_history => %s)",
                [cutoff, 2**31 - 1 if dry_run else batch, dry_run, keep_history],
            )
            row = dict(zip(COUNTS, cur.fetchone(), strict=True))
        took = time.monotonic() - batch_started
        report.batch_s.append(took)
        report.batches += 1
        for key, value in row.items():
            report.counts[key] += int(value or 0)
        if dry_run or not row["traces"]:
            break
        log.info(
            "pruned %s trace(s), %s ticket(s) finished before %s",
            row["traces"],
            row["tickets"],
            report.cutoff,
        )
        if max_s is not None and time.monotonic() - started >= max_s:
            report.complete = False
            log.info("prune stopped after %.0f s (its budget); the next run goes on", max_s)
            break
        # A wait on the event, not a sleep: a stop ends the pause at once.
        pause = pause_ratio * took
        if stop.wait(pause):
            report.complete = False
            break
        report.paused_s += pause
    return report
