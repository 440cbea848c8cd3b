"""The ledger audit: the invariants the runtime promises, checked over the
whole ledger by set-based SQL (``python manage.py audit_ledger``).

A selector: it reads every app's records and writes nothing. Each check is
one statement (window functions, joins through primary keys and the
indexes the runtime already has); none loops over rows in Python, so the
cost follows a few scans of the big tables (see docs/explanation/faults.md for the time
on a 1M-ticket ledger). All checks read one snapshot (REPEATABLE READ, READ
ONLY) and one clock (the snapshot's time), so a busy ledger cannot show
a half-made transition between two checks.

Kinds of violation (each names the ids involved):

- ``turn_overlap``: two turns of one endpoint overlap in time, an interval
  being ``[started_at, ended_at or now]``. The lock makes turns of an
  endpoint strictly sequential.
- ``seq_order``: ``seq`` (the fencing token) not strictly increasing per
  endpoint in start order, not unique, or above the endpoint's ``turn_seq``.
- ``foreign_result``: a result that did not come from the ticket's
  registered turn. A succeeded ticket's completing turn is its own turn
  (``ticket.turn``, completed, of this ticket) or, for a ticket that waited,
  the turn it is attributed to (``completed_by_turn``), which must be one
  that may complete it (docs/explanation/design.md, "Who completes a waiting ticket";
  ``runtime.turns.finish.answers``): a completed turn of the same endpoint
  and trace that ran one of its callbacks or approval tickets (or an
  owner's re-run of one), later than the turn that asked for its last
  round. The transition event to ``succeeded`` names that turn. A result
  on a ticket that did not succeed, and a context entry that is not its
  turn's, are violations too.
- ``replayed_ticket``: a ticket with more than one turn or more than one
  ``turn_started`` event (work run twice).
- ``running_without_turn``: a running ticket whose registered turn is not
  live (running / interrupting) and that has no open recovery case.
- ``recovering_without_case``: a recovering ticket without an open case on
  its uncertain turn.
- ``lock_mismatch``: a live or uncertain turn that is not its ticket's
  registered turn in the matching state, or does not hold its endpoint's
  lock with its ``seq``; a held lock whose holder is not such a turn.
- ``quarantine_cases``: a quarantined endpoint without exactly one open
  case, an available endpoint with an open case, an open case whose turn is
  not uncertain.
- ``duplicate_callback``: more than one callback (row or callback ticket)
  for one source ticket, or a callback row whose ticket reports another
  source.
- ``stranded_queued``: a queued ticket of an available, unpaused endpoint whose lock
  is free, with no dispatch message owed or in flight. Owed: the ticket is
  marked ``needs_dispatch``. In flight: a message was published within the
  last ``REDISPATCH_AFTER_S``, which the ledger shows as the ticket's
  admission or last update (``created_at`` / ``updated_at``) or the
  endpoint's last release (its latest turn's ``ended_at``; the release
  publishes the next ticket). Past that window the design itself counts the
  message as lost (the lost-dispatch sweep re-publishes, writing nothing), so
  a ticket named here lives only on that backstop.
- ``discarded_result``: a ticket failed ``timed_out`` or ``interrupted``
  whose exact turn (the ticket's registered turn) reported a success that
  returned before its interrupt was requested: an event of that turn (its
  ``turn_stopped``, or a ``stale_outcome``) says ``outcome: success`` with a
  ``returned_by`` earlier than the turn's ``interrupt_requested_at``. Such
  a result is the turn's (``runtime.turns.finish.late_outcome_accepted``).
- ``event_state_mismatch``: the last transition event's ``to_state`` is not
  the ticket's state, a ticket has no transition event, or a transition
  event's ``from_state`` is not the previous one's ``to_state``.
- ``forbidden_edge``: a transition event records a ``(from_state,
  to_state)`` that is no edge of the ticket state machine
  (``claimcheck_ticket_edge_ok``, generated from ``TICKET_EDGES``; an
  admission's ``'' -> queued`` is one). The database refuses such a change
  of the ticket row; an event row saying one was written past it.
- ``turn_generation``: a turn names a generation its endpoint does not
  have, or its seq lies outside that generation's range (from its
  ``first_seq`` to the next generation's): it did not run under it.
- ``generation_gap``: an endpoint's generation numbers do not run 1..N
  without a gap, or the endpoint is not at its newest generation N.
- ``generation_drift``: the endpoint row's behaviour-defining configuration
  is not its current generation's (changed outside a generation).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from endpoints.models import Endpoint, EndpointGeneration
from tickets.models import (
    Callback,
    ContextEntry,
    EndpointLock,
    LedgerEvent,
    Ticket,
    TicketEvent,
    Turn,
)

from .models import RecoveryCase

# How many violations of one kind are listed (all are counted).
DEFAULT_LIMIT = 100

KINDS = (
    "turn_overlap",
    "seq_order",
    "foreign_result",
    "replayed_ticket",
    "running_without_turn",
    "recovering_without_case",
    "lock_mismatch",
    "quarantine_cases",
    "duplicate_callback",
    "stranded_queued",
    "discarded_result",
    "event_state_mismatch",
    "forbidden_edge",
    "turn_generation",
    "generation_gap",
    "generation_drift",
)


@dataclass(frozen=True)
class Violation:
    kind: str
    ids: dict[str, Any]
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ids": self.ids, "detail": self.detail}

    def line(self) -> str:
        ids = " ".join(f"{k}={_short(v)}" for k, v in self.ids.items() if v is not None)
        return f"{self.kind} {ids}: {self.detail}"


@dataclass
class AuditReport:
    checked_at: datetime
    since: datetime | None
    seconds: float
    violations: list[Violation]
    # kind -> how many (the list holds at most ``limit`` of each)
    counts: dict[str, int] = field(default_factory=dict)
    check_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_at": self.checked_at.isoformat(),
            "since": self.since.isoformat() if self.since else None,
            "seconds": round(self.seconds, 3),
            "check_seconds": {k: round(v, 3) for k, v in self.check_seconds.items()},
            "counts": self.counts,
            "violations": [v.as_dict() for v in self.violations],
        }


def _short(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def uuid7_floor(moment: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond: ids are time-ordered
    (``core.ids.new_id``), so ``id >= uuid7_floor(t)`` selects the rows
    created since ``t`` through the primary key."""
    ms = int(moment.timestamp() * 1000)
    return uuid.UUID(int=ms << 80)


def _tables() -> dict[str, str]:
    return {
        "endpoint": Endpoint._meta.db_table,
        "lock": EndpointLock._meta.db_table,
        "turn": Turn._meta.db_table,
        "entry": ContextEntry._meta.db_table,
        "ticket": Ticket._meta.db_table,
        "event": TicketEvent._meta.db_table,
        # The event rows and the admission events ticket rows imply: the
        # transition chain starts at the admission either way.
        "event_all": LedgerEvent._meta.db_table,
        "callback": Callback._meta.db_table,
        "case": RecoveryCase._meta.db_table,
        "generation": EndpointGeneration._meta.db_table,
    }


# --- The checks -------------------------------------------------------------------------------
# Each is one statement returning (kind, ids jsonb, detail). ``{scope_*}``
# fragments restrict to rows created since ``--since`` (through primary keys
# or (endpoint, seq)); they are empty for the whole ledger. Parameters:
# now, bound (a UUIDv7 floor or NULL), cutoff (now - in-flight window).

_TURNS = """
WITH run AS (
    -- One scan of the turns in start order per endpoint. run_end is the
    -- latest end so far (a frame ending at 1 PRECEDING would be aggregated
    -- again for every row: quadratic).
    SELECT tu.id, tu.endpoint_id, tu.seq, tu.started_at, e.address, e.turn_seq,
        lag(tu.seq) OVER o AS prev_seq,
        lag(tu.id) OVER o AS prev_id,
        max(COALESCE(tu.ended_at, %(now)s))
            OVER (o ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run_end
    FROM {turn} tu
    JOIN {endpoint} e ON e.id = tu.endpoint_id
    {scope_turns}
    WINDOW o AS (PARTITION BY tu.endpoint_id ORDER BY tu.started_at, tu.seq, tu.id)
), bad AS (
    SELECT * FROM (
        -- prev_end: the latest end of every earlier turn, so a long turn
        -- that overlaps several later ones is seen by each of them.
        SELECT run.*, lag(run.run_end) OVER o AS prev_end
        FROM run
        WINDOW o AS (PARTITION BY run.endpoint_id ORDER BY run.started_at, run.seq, run.id)
    ) w
    WHERE (w.started_at < w.prev_end OR w.seq <= w.prev_seq OR w.seq > w.turn_seq) {scope_bad}
)
SELECT 'turn_overlap',
    jsonb_build_object('endpoint', bad.address, 'turn', bad.id, 'overlaps', other.id),
    format('turn #%%s started at %%s, before turn #%%s ended (%%s)',
           bad.seq, bad.started_at, other.seq, other.ends)
FROM bad
-- Only for the few flagged turns: which earlier turn it overlaps.
JOIN LATERAL (
    SELECT o.id, o.seq, COALESCE(o.ended_at, %(now)s) AS ends FROM {turn} o
    WHERE o.endpoint_id = bad.endpoint_id AND o.id <> bad.id
      AND o.started_at <= bad.started_at AND COALESCE(o.ended_at, %(now)s) > bad.started_at
    ORDER BY o.started_at DESC, o.seq DESC LIMIT 1
) other ON true
WHERE bad.started_at < bad.prev_end
UNION ALL
SELECT 'seq_order',
    jsonb_build_object('endpoint', bad.address, 'turn', bad.id, 'previous', bad.prev_id),
    format('turn #%%s started after turn #%%s: seq must rise strictly in start order',
           bad.seq, bad.prev_seq)
FROM bad
WHERE bad.seq <= bad.prev_seq
UNION ALL
SELECT 'seq_order', jsonb_build_object('endpoint', bad.address, 'turn', bad.id),
    format('turn #%%s is above the endpoint''s turn_seq %%s', bad.seq, bad.turn_seq)
FROM bad
WHERE bad.seq > bad.turn_seq
"""

_TICKETS = """
SELECT kind, ids, detail FROM (
    SELECT 'foreign_result' AS kind,
        jsonb_build_object('ticket', t.id, 'turn', t.turn_id) AS ids,
        CASE
            WHEN tu.id IS NULL THEN 'succeeded without a registered turn'
            WHEN tu.ticket_id <> t.id THEN 'its registered turn ran ticket ' || tu.ticket_id
            WHEN tu.state <> 'completed' THEN 'succeeded, but its registered turn is ' || tu.state
        END AS detail
    FROM {ticket} t
    LEFT JOIN {turn} tu ON tu.id = t.turn_id
    WHERE t.state = 'succeeded' {scope_t}
) s WHERE detail IS NOT NULL
UNION ALL
-- A ticket that waited: the turn it is attributed to (rare rows, through
-- the completed_by_turn index) must be one that may complete it
-- (docs/explanation/design.md, "Who completes a waiting ticket"). From that turn's
-- ticket up through its re-runs and its callback link (each hangs under
-- what it re-runs or reports) to the ticket it answers for: a child of
-- the waiting ticket when a callback link was crossed, else the waiting
-- ticket's own approval ticket.
SELECT kind, ids, detail FROM (
    WITH RECURSIVE done AS (
        SELECT t.id, t.endpoint_id, t.trace_id, t.completed_by_turn_id AS by_turn
        FROM {ticket} t
        WHERE t.completed_by_turn_id IS NOT NULL {scope_t}
    ), up AS (
        SELECT d.id AS done_id, x.id, x.parent_id, x.rerun_of_id, x.callback_for_id,
            x.endpoint_id, x.dedupe_key, x.submitted_by_id, false AS via_callback, 0 AS hops
        FROM done d
        JOIN {turn} cb ON cb.id = d.by_turn
        JOIN {ticket} x ON x.id = cb.ticket_id
        UNION ALL
        SELECT up.done_id, n.id, n.parent_id, n.rerun_of_id, n.callback_for_id,
            n.endpoint_id, n.dedupe_key, n.submitted_by_id,
            up.via_callback OR up.callback_for_id = up.parent_id, up.hops + 1
        FROM up
        JOIN {ticket} n ON n.id = up.parent_id
        WHERE (up.callback_for_id = up.parent_id OR up.rerun_of_id = up.parent_id)
          AND up.hops < 64
    ), top AS (
        -- The first ticket up the chain that is neither a re-run nor a callback.
        SELECT DISTINCT ON (up.done_id) up.*
        FROM up
        ORDER BY up.done_id, up.hops DESC
    )
    SELECT 'foreign_result' AS kind,
        jsonb_build_object('ticket', d.id, 'completed_by', d.by_turn) AS ids,
        CASE
            WHEN cb.id IS NULL THEN 'its attributed turn does not exist'
            WHEN cb.endpoint_id <> d.endpoint_id THEN 'attributed to a turn of another endpoint'
            WHEN cb.state <> 'completed' THEN 'attributed to a turn that is ' || cb.state
            WHEN top.parent_id IS DISTINCT FROM d.id OR NOT (top.via_callback OR (
                    top.endpoint_id = d.endpoint_id AND top.callback_for_id IS NULL
                    AND top.submitted_by_id IS NULL
                    AND starts_with(top.dedupe_key, 'approval:' || d.id || ':')))
                THEN 'attributed to turn #' || cb.seq || ' of ticket ' || cb.ticket_id
                     || ', which answers no call of this ticket (neither the callback of one '
                     || 'of its children nor its approval ticket)'
            WHEN cbt.trace_id <> d.trace_id
                THEN 'attributed to turn #' || cb.seq || ', of another trace'
            WHEN last_wait.seq IS NULL
                THEN 'attributed to turn #' || cb.seq || ', but the ticket never waited'
            WHEN cb.seq <= last_wait.seq
                THEN 'attributed to turn #' || cb.seq || ', which ran before the round it '
                     || 'waited on last (asked for by turn #' || last_wait.seq || ')'
        END AS detail
    FROM done d
    LEFT JOIN {turn} cb ON cb.id = d.by_turn
    LEFT JOIN {ticket} cbt ON cbt.id = cb.ticket_id
    LEFT JOIN top ON top.done_id = d.id
    -- The turn that asked for the last round (its wait event, through
    -- event_ticket_idx).
    LEFT JOIN LATERAL (
        SELECT wt.seq FROM {event} e JOIN {turn} wt ON wt.id = e.turn_id
        WHERE e.ticket_id = d.id AND e.kind IN ('waiting_for_children', 'waiting_again')
        ORDER BY e.id DESC LIMIT 1
    ) last_wait ON true
) s WHERE detail IS NOT NULL
UNION ALL
SELECT 'foreign_result', jsonb_build_object('ticket', t.id, 'turn', t.turn_id),
    'a ' || t.state || ' ticket holds a result: only a completing turn writes one'
FROM {ticket} t
WHERE t.state <> 'succeeded' AND t.result IS NOT NULL AND t.result <> 'null'::jsonb {scope_t}
UNION ALL
SELECT 'running_without_turn', jsonb_build_object('ticket', t.id, 'turn', t.turn_id),
    'running, but its registered turn is ' || COALESCE(tu.state, 'missing')
    || CASE WHEN tu.ticket_id <> t.id THEN ' (and ran another ticket)' ELSE '' END
    || ', and no recovery case is open for it'
FROM {ticket} t
LEFT JOIN {turn} tu ON tu.id = t.turn_id
WHERE t.state = 'running' {scope_t}
  AND (tu.id IS NULL OR tu.ticket_id <> t.id OR tu.state NOT IN ('running', 'interrupting'))
  AND NOT EXISTS (SELECT 1 FROM {case} c WHERE c.ticket_id = t.id AND c.state = 'open')
UNION ALL
SELECT 'recovering_without_case', jsonb_build_object('ticket', t.id, 'turn', t.turn_id),
    'recovering, but no open case names its turn (which is '
    || COALESCE(tu.state, 'missing') || ')'
FROM {ticket} t
LEFT JOIN {turn} tu ON tu.id = t.turn_id
WHERE t.state = 'recovering' {scope_t}
  AND (tu.state IS DISTINCT FROM 'uncertain' OR NOT EXISTS (
        SELECT 1 FROM {case} c
        WHERE c.ticket_id = t.id AND c.turn_id = t.turn_id AND c.state = 'open'))
"""

_ENTRIES = """
SELECT 'foreign_result',
    jsonb_build_object('context_entry', ce.id, 'turn', ce.turn_id, 'ticket', ce.ticket_id),
    'context entry #' || ce.seq || ' does not match its turn (#' || tu.seq || ', '
    || tu.state || ', ticket ' || tu.ticket_id || ')'
FROM {entry} ce
JOIN {turn} tu ON tu.id = ce.turn_id
WHERE (ce.ticket_id <> tu.ticket_id OR ce.seq <> tu.seq OR ce.endpoint_id <> tu.endpoint_id
       OR tu.state NOT IN ('completed', 'failed')) {scope_ce}
"""

_REPLAYS = """
WITH twice AS (
    SELECT ticket_id FROM {turn} tu WHERE true {scope_tu}
    GROUP BY ticket_id HAVING count(*) > 1
)
SELECT 'replayed_ticket',
    jsonb_build_object('ticket', tu.ticket_id, 'turns', jsonb_agg(tu.id ORDER BY tu.seq)),
    count(*) || ' turns ran this ticket (seq ' || string_agg(tu.seq::text, ', ' ORDER BY tu.seq)
    || ')'
FROM twice JOIN {turn} tu ON tu.ticket_id = twice.ticket_id
GROUP BY tu.ticket_id
"""

_LOCKS = """
SELECT 'lock_mismatch',
    jsonb_build_object('endpoint', e.address, 'turn', tu.id, 'ticket', tu.ticket_id,
                       'holder', l.holder_id),
    format('%%s turn #%%s: lock held by %%s with token %%s; its ticket is %%s and registers %%s',
           tu.state, tu.seq, COALESCE(l.holder_id::text, 'nobody'),
           COALESCE(l.token::text, 'none'), t.state, COALESCE(t.turn_id::text, 'no turn'))
FROM {turn} tu
JOIN {endpoint} e ON e.id = tu.endpoint_id
JOIN {lock} l ON l.endpoint_id = tu.endpoint_id
JOIN {ticket} t ON t.id = tu.ticket_id
WHERE tu.state IN ('running', 'interrupting', 'uncertain')
  AND (l.holder_id IS DISTINCT FROM tu.id OR l.token IS DISTINCT FROM tu.seq
       OR t.turn_id IS DISTINCT FROM tu.id
       OR t.state <> CASE WHEN tu.state = 'uncertain' THEN 'recovering' ELSE 'running' END)
UNION ALL
SELECT 'lock_mismatch',
    jsonb_build_object('endpoint', e.address, 'holder', l.holder_id),
    format('lock held with token %%s by a turn that is %%s (seq %%s, endpoint %%s)',
           l.token, COALESCE(tu.state, 'missing'), tu.seq, tu.endpoint_id)
FROM {lock} l
JOIN {endpoint} e ON e.id = l.endpoint_id
LEFT JOIN {turn} tu ON tu.id = l.holder_id
WHERE l.holder_id IS NOT NULL
  AND (tu.id IS NULL OR tu.endpoint_id <> l.endpoint_id OR tu.seq IS DISTINCT FROM l.token
       OR tu.state NOT IN ('running', 'interrupting', 'uncertain'))
"""

_QUARANTINE = """
WITH open_cases AS (
    SELECT endpoint_id, count(*) AS n, jsonb_agg(id ORDER BY opened_at) AS ids
    FROM {case} WHERE state = 'open' GROUP BY endpoint_id
)
SELECT 'quarantine_cases', jsonb_build_object('endpoint', e.address, 'cases', oc.ids),
    e.state || ' endpoint with ' || COALESCE(oc.n, 0) || ' open case(s)'
    || CASE WHEN e.state = 'quarantined' THEN ' (needs exactly one)' ELSE ' (needs none)' END
FROM {endpoint} e
LEFT JOIN open_cases oc ON oc.endpoint_id = e.id
WHERE (e.state = 'quarantined' AND COALESCE(oc.n, 0) <> 1)
   OR (e.state <> 'quarantined' AND COALESCE(oc.n, 0) > 0)
UNION ALL
SELECT 'quarantine_cases',
    jsonb_build_object('endpoint', e.address, 'cases', jsonb_build_array(c.id), 'turn', c.turn_id),
    'open case whose turn is ' || COALESCE(tu.state, 'missing') || ', not uncertain'
FROM {case} c
JOIN {endpoint} e ON e.id = c.endpoint_id
LEFT JOIN {turn} tu ON tu.id = c.turn_id
WHERE c.state = 'open' AND tu.state IS DISTINCT FROM 'uncertain'
"""

_CALLBACKS = """
SELECT 'duplicate_callback',
    jsonb_build_object('source', cb.source_id, 'callbacks', jsonb_agg(cb.id ORDER BY cb.id)),
    count(*) || ' callback rows for one source ticket'
FROM {callback} cb
WHERE cb.source_id IN (
    SELECT source_id FROM {callback} WHERE true {scope_cb}
    GROUP BY source_id HAVING count(*) > 1)
GROUP BY cb.source_id
UNION ALL
SELECT 'duplicate_callback',
    jsonb_build_object('source', t.callback_for_id, 'tickets', jsonb_agg(t.id ORDER BY t.id)),
    count(*) || ' callback tickets for one source ticket'
FROM {ticket} t
WHERE t.callback_for_id IN (
    SELECT callback_for_id FROM {ticket}
    WHERE callback_for_id IS NOT NULL {scope_cbt}
    GROUP BY callback_for_id HAVING count(*) > 1)
GROUP BY t.callback_for_id
UNION ALL
SELECT 'duplicate_callback',
    jsonb_build_object('source', cb.source_id, 'callback', cb.id, 'ticket', cb.ticket_id),
    'the callback''s ticket reports ' || COALESCE(ct.callback_for_id::text, 'no source')
    || ', not its source'
FROM {callback} cb
JOIN {ticket} ct ON ct.id = cb.ticket_id
WHERE ct.callback_for_id IS DISTINCT FROM cb.source_id {scope_cb}
"""

_STRANDED = """
SELECT 'stranded_queued', jsonb_build_object('ticket', t.id, 'endpoint', e.address),
    format('queued since %%s on a free, available endpoint (last release %%s), not marked '
           'needs_dispatch and nothing published for it in the last %%s s',
           t.created_at, COALESCE(last.ended_at::text, 'never'), %(window)s)
FROM {ticket} t
JOIN {endpoint} e ON e.id = t.endpoint_id
    AND claimcheck_endpoint_may_start(p_state => e.state, p_paused_at => e.paused_at)
JOIN {lock} l ON l.endpoint_id = t.endpoint_id AND l.holder_id IS NULL
-- The endpoint's last turn through (endpoint, seq): its end is the last release.
LEFT JOIN LATERAL (
    SELECT tu.ended_at FROM {turn} tu WHERE tu.endpoint_id = t.endpoint_id
    ORDER BY tu.seq DESC LIMIT 1
) last ON true
WHERE t.state = 'queued' AND NOT t.needs_dispatch {scope_t}
  AND t.created_at < %(cutoff)s AND t.updated_at < %(cutoff)s
  AND (last.ended_at IS NULL OR last.ended_at < %(cutoff)s)
"""

_DISCARDED = """
SELECT 'discarded_result',
    jsonb_build_object('ticket', t.id, 'turn', tu.id, 'event', ev.id),
    format('failed %%s, but turn #%%s reported a success that returned by %%s, before its '
           'interrupt at %%s (%%s event)',
           t.error->>'code', tu.seq, ev.detail->>'returned_by', tu.interrupt_requested_at, ev.kind)
FROM {ticket} t
JOIN {turn} tu ON tu.id = t.turn_id AND tu.interrupt_requested_at IS NOT NULL
-- The ticket's own events through event_ticket_idx; only its turn's reports.
JOIN LATERAL (
    SELECT e.id, e.kind, e.detail FROM {event} e
    WHERE e.ticket_id = t.id AND e.turn_id = tu.id
      AND e.kind IN ('turn_stopped', 'stale_outcome')
      AND e.detail->>'outcome' = 'success' AND e.detail ? 'returned_by'
      AND (e.detail->>'returned_by')::timestamptz < tu.interrupt_requested_at
    ORDER BY e.id LIMIT 1
) ev ON true
WHERE t.state = 'failed' AND t.error->>'code' IN ('timed_out', 'interrupted') {scope_t}
"""

_EVENTS = """
WITH per AS (
    -- One pass over the transition events (admission included: '' ->
    -- queued, a row or implied by the ticket's) in (ticket, id) order,
    -- folded to one row per ticket.
    SELECT ev.ticket_id,
        max(ev.id) AS last_id,
        max(ev.to_state) FILTER (WHERE ev.is_last) AS last_to,
        max(ev.kind) FILTER (WHERE ev.is_last) AS last_kind,
        (array_agg(ev.turn_id) FILTER (WHERE ev.is_last))[1] AS last_turn,
        count(*) FILTER (WHERE ev.kind = 'turn_started') AS starts,
        min(ev.id) FILTER (WHERE ev.broken) AS broken_id,
        min(ev.id) FILTER (WHERE ev.forbidden) AS forbidden_id
    FROM (
        SELECT e.ticket_id, e.id, e.kind, e.to_state, e.turn_id,
            e.from_state IS DISTINCT FROM COALESCE(lag(e.to_state) OVER o, '') AS broken,
            -- The edge the event records, against the state machine the
            -- database enforces on every write (tickets/machines.py).
            NOT claimcheck_ticket_edge_ok(p_from => e.from_state, p_to => e.to_state)
                AS forbidden,
            lead(e.id) OVER o IS NULL AS is_last
        FROM {event_all} e
        WHERE e.to_state <> '' {scope_ev}
        WINDOW o AS (PARTITION BY e.ticket_id ORDER BY e.id)
    ) ev
    GROUP BY ev.ticket_id
), flagged AS (
    -- Cheap tests first: the reports below are built for these rows only.
    SELECT t.id, t.state, t.turn_id, t.completed_by_turn_id, per.*,
        per.ticket_id IS NULL OR per.last_to <> t.state AS mismatch,
        t.state = 'succeeded' AND per.last_to = 'succeeded'
            AND per.last_turn IS DISTINCT FROM COALESCE(t.completed_by_turn_id, t.turn_id)
            AS foreign
    FROM {ticket} t
    LEFT JOIN per ON per.ticket_id = t.id
    WHERE (per.ticket_id IS NULL OR per.last_to <> t.state OR per.broken_id IS NOT NULL
           OR per.forbidden_id IS NOT NULL OR per.starts > 1
           OR (t.state = 'succeeded' AND per.last_to = 'succeeded'
               AND per.last_turn IS DISTINCT FROM COALESCE(t.completed_by_turn_id, t.turn_id)))
          {scope_t}
)
SELECT v.kind, v.ids, v.detail
FROM flagged f
-- By id, the rows: an implied admission is first and along an edge, never
-- broken or forbidden.
LEFT JOIN {event} b ON b.id = f.broken_id
LEFT JOIN {event} fb ON fb.id = f.forbidden_id
LEFT JOIN LATERAL (
    SELECT p.to_state FROM {event_all} p
    WHERE p.ticket_id = f.id AND p.id < f.broken_id AND p.to_state <> ''
    ORDER BY p.id DESC LIMIT 1
) prev ON true
CROSS JOIN LATERAL (VALUES
    (CASE WHEN f.mismatch THEN 'event_state_mismatch' END,
     jsonb_build_object('ticket', f.id, 'event', f.last_id),
     CASE WHEN f.ticket_id IS NULL THEN 'ticket is ' || f.state || ' but has no transition event'
          ELSE 'ticket is ' || f.state || ' but its last transition event (' || f.last_kind
               || ') says ' || f.last_to END),
    (CASE WHEN f.broken_id IS NOT NULL THEN 'event_state_mismatch' END,
     jsonb_build_object('ticket', f.id, 'event', f.broken_id),
     format('event %%s moves %%s -> %%s, but the previous transition ended in %%s',
            b.kind, COALESCE(NULLIF(b.from_state, ''), '(nothing)'), b.to_state,
            COALESCE(prev.to_state, '(nothing)'))),
    (CASE WHEN f.forbidden_id IS NOT NULL THEN 'forbidden_edge' END,
     jsonb_build_object('ticket', f.id, 'event', f.forbidden_id),
     format('event %%s moves %%s -> %%s, an edge the ticket state machine does not have',
            fb.kind, COALESCE(NULLIF(fb.from_state, ''), '(nothing)'), fb.to_state)),
    (CASE WHEN f.starts > 1 THEN 'replayed_ticket' END,
     jsonb_build_object('ticket', f.id),
     f.starts || ' turn_started events'),
    -- The event that made the ticket succeed names the turn it took the result from.
    (CASE WHEN f.foreign THEN 'foreign_result' END,
     jsonb_build_object('ticket', f.id, 'event', f.last_id, 'turn', f.last_turn),
     'the transition to succeeded names turn ' || COALESCE(f.last_turn::text, '(none)')
     || ', not the completing turn '
     || COALESCE(f.completed_by_turn_id, f.turn_id)::text)
) AS v(kind, ids, detail)
WHERE v.kind IS NOT NULL
"""

_GENERATIONS = """
SELECT 'turn_generation',
    jsonb_build_object('endpoint', e.address, 'turn', tu.id, 'generation', tu.generation),
    CASE WHEN g.id IS NULL
         THEN format('turn #%%s names generation %%s, which the endpoint does not have',
                     tu.seq, tu.generation)
         ELSE format('turn #%%s is outside generation %%s (its turns are from #%%s%%s)',
                     tu.seq, tu.generation, g.first_seq,
                     COALESCE(' to #' || (nx.first_seq - 1), ''))
    END
FROM {turn} tu
JOIN {endpoint} e ON e.id = tu.endpoint_id
LEFT JOIN {generation} g ON g.endpoint_id = tu.endpoint_id AND g.number = tu.generation
LEFT JOIN {generation} nx ON nx.endpoint_id = tu.endpoint_id AND nx.number = tu.generation + 1
WHERE (g.id IS NULL OR tu.seq < g.first_seq OR tu.seq >= nx.first_seq) {scope_tu}
UNION ALL
SELECT 'generation_gap', jsonb_build_object('endpoint', e.address, 'generation', e.generation),
    format('generations %%s: they must run from 1 without a gap, the endpoint at the newest',
           COALESCE(s.numbers::text, 'none'))
FROM {endpoint} e
JOIN LATERAL (
    SELECT count(*) AS n, min(number) AS low, max(number) AS top,
        array_agg(number ORDER BY number) AS numbers
    FROM {generation} g WHERE g.endpoint_id = e.id
) s ON true
WHERE s.n = 0 OR s.low <> 1 OR s.top <> s.n OR e.generation <> s.top
UNION ALL
SELECT 'generation_drift', jsonb_build_object('endpoint', e.address, 'generation', e.generation),
    'the endpoint''s configuration is not its current generation''s'
FROM {endpoint} e
JOIN {generation} g ON g.endpoint_id = e.id AND g.number = e.generation
WHERE g.config <> jsonb_build_object(
    'runner', e.runner, 'turn_budget_s', e.turn_budget_s,
    'interrupt_grace_s', e.interrupt_grace_s, 'heartbeat_timeout_s', e.heartbeat_timeout_s,
    'busy_policy', e.busy_policy, 'requires_approval', e.requires_approval, 'notes', e.notes)
"""

CHECKS: dict[str, str] = {
    "turns": _TURNS,
    "tickets": _TICKETS,
    "context_entries": _ENTRIES,
    "replays": _REPLAYS,
    "locks": _LOCKS,
    "quarantine": _QUARANTINE,
    "callbacks": _CALLBACKS,
    "dispatch": _STRANDED,
    "discarded": _DISCARDED,
    "events": _EVENTS,
    "generations": _GENERATIONS,
}


def _scopes(since: bool) -> dict[str, str]:
    if not since:
        return dict.fromkeys(
            ("scope_turns", "scope_bad", "scope_t", "scope_ce", "scope_tu", "scope_cb",
             "scope_cbt", "scope_ev"),
            "",
        )  # fmt: skip
    return {
        # Turns started since, each with its predecessor (through the unique
        # (endpoint, seq) index) so the first one is compared too.
        "scope_turns": """JOIN (SELECT endpoint_id, min(seq) - 1 AS from_seq FROM {turn}
                               WHERE id >= %(bound)s GROUP BY endpoint_id) s
                          ON s.endpoint_id = tu.endpoint_id AND tu.seq >= s.from_seq""",
        "scope_bad": "AND w.id >= %(bound)s",
        "scope_t": "AND t.id >= %(bound)s",
        "scope_ce": "AND ce.ticket_id >= %(bound)s",
        "scope_tu": "AND tu.ticket_id >= %(bound)s",
        "scope_cb": "AND cb.source_id >= %(bound)s",
        "scope_cbt": "AND callback_for_id >= %(bound)s",
        "scope_ev": "AND e.ticket_id >= %(bound)s",
    }


def _statement(template: str, since: bool) -> str:
    tables = _tables()
    scopes = {k: v.format(**tables) for k, v in _scopes(since).items()}
    body = template.format(**tables, **scopes)
    # At most ``limit`` of each kind, and how many there are.
    return f"""
    SELECT kind, ids, detail, total FROM (
        SELECT v.*, row_number() OVER (PARTITION BY kind) AS rn,
               count(*) OVER (PARTITION BY kind) AS total
        FROM ({body}) AS v(kind, ids, detail)
    ) x WHERE rn <= %(limit)s
    """


def audit_ledger(
    *,
    since: datetime | None = None,
    limit: int = DEFAULT_LIMIT,
    in_flight_s: float | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> AuditReport:
    """Run every check over one snapshot of the ledger.

    ``since`` restricts the checks to tickets, turns and callbacks created
    since then (each turn still compared with the one before it); endpoints,
    locks and cases are always checked whole. ``in_flight_s`` is how recent a
    publish must be to count as in flight (default ``REDISPATCH_AFTER_S``).
    ``using`` names the database alias.
    """
    connection = connections[using]
    window = settings.REDISPATCH_AFTER_S if in_flight_s is None else in_flight_s
    started = time.monotonic()
    violations: list[Violation] = []
    counts: dict[str, int] = {}
    timings: dict[str, float] = {}
    # Inside a caller's transaction (a test's) the checks use its snapshot.
    outer = connection.in_atomic_block
    with transaction.atomic(using=using), connection.cursor() as cur:
        if not outer:
            # One snapshot for every check; nothing here writes.
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # JIT would compile these plans (their lateral joins look costly to
        # the planner) for seconds while the scans themselves take
        # milliseconds: the compile would be most of the audit's time.
        cur.execute("SET LOCAL jit = off")
        # The clock of the snapshot (taken by this first query). Not now(): in
        # a caller's transaction that is when the caller's transaction began.
        cur.execute(
            "SELECT statement_timestamp(),"
            " statement_timestamp() - make_interval(secs => %s::float8)",
            [window],
        )
        now, cutoff = cur.fetchone()
        params = {
            "now": now,
            "cutoff": cutoff,
            "window": window,
            "bound": uuid7_floor(since) if since else None,
            "limit": limit,
        }
        for name, template in CHECKS.items():
            t0 = time.monotonic()
            cur.execute(_statement(template, since is not None), params)
            totals: dict[str, int] = {}
            for kind, ids, detail, total in cur.fetchall():
                ids = json.loads(ids) if isinstance(ids, str) else ids
                violations.append(Violation(kind=kind, ids=ids, detail=detail))
                totals[kind] = int(total)
            # Several checks report some kinds (foreign_result, replayed_ticket).
            for kind, total in totals.items():
                counts[kind] = counts.get(kind, 0) + total
            timings[name] = time.monotonic() - t0
    return AuditReport(
        checked_at=now,
        since=since,
        seconds=time.monotonic() - started,
        violations=violations,
        counts=counts,
        check_seconds=timings,
    )
