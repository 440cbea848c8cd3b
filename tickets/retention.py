"""Retention: delete finished work older than a cutoff, in batches, through
one privileged, narrow path.

The unit is a trace (every ticket of a lineage shares its trace: children
inherit it, callbacks and re-runs carry it). A trace is pruned whole, with
its tickets' events, turns, context entries, callbacks, deliveries and
delivery attempts, only when every one of its tickets:

1. is terminal (succeeded, failed, cancelled, orphaned) and finished before
   the cutoff, with no open obligation and no pending callback, and no
   delivery still due;
2. is not held (``RetentionHold``): an app above the ledger holds the
   tickets its records point at, recovery those of every case (its ticket
   and its turn's) and every decision's re-run, so a case's evidence,
   inspections, decisions and lesson are never deleted, and neither is
   anything they point at, while the prune reads only the ledger's tables;
3. has no turn still active or holding an endpoint's lock, and no context
   entry among its endpoint's most recent ``HISTORY_ENTRIES`` (the history
   the next turn is given);
4. has no link (parent, re-run, callback, completing turn) to a ticket of
   another trace, in either direction.

The rule is one function, ``claimcheck_prune_keeps``
(tickets/sql/claimcheck_prune_keeps.sql), called for each candidate trace.
The deletion happens in ``claimcheck_prune_ledger``
(tickets/sql/claimcheck_prune_ledger.sql), a SECURITY DEFINER function
installed after migrate like every function of that folder and owned by
the owner role. The application role may EXECUTE it and nothing more: it still
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
