"""Does the ledger's history cost? Reads, pages and sweeps timed with 10,000
tickets and again with 1,000,000, and the bytes a ticket takes.

    .venv/bin/python bench/scale.py [--small 10000] [--large 1000000] [-r 15] [--keep]

Two databases, one per size: ``claimcheck_bench_scale_small`` and
``claimcheck_bench_scale`` (created, migrated and dropped at the end; ``--keep``
keeps them), each served by a child process of this script that seeds it and
then runs what the parent asks; Redis db 11 (the sweeps publish there; flushed).
The machine is shared, so the two sizes are timed in turn, run by run, not one
after the other: both see the same background load and the growth ratio holds.

The ledger is seeded by SQL (``INSERT ... SELECT ... FROM generate_series``,
in batches of 100,000), shaped like what the pipeline writes (see
``bench/README.md``): per ticket its row, its events (4 for a finished
ticket: admitted, turn_started, turn_completed or turn_failed with the
outcome's digest and the delivery it opened, delivered or
delivery_acknowledged), its turn, its context
entry, its delivery (and the webhook's attempt) and its trace row; ids are
UUIDv7 of the creation time, as ``core.ids.new_id`` makes them. Of every
100 tickets 4 failed and 1 was cancelled; half deliver by webhook; 1 in 200
is a pull delivery nobody acknowledged (its obligation stays open, flagged
overdue). The newest 100 tickets are queued; a 50-ticket trace (a root and 49
children) is the lineage.

Both ledgers hold the same ``--small`` newest tickets (the same ids: the seed
is deterministic); the large one has older history behind them, so both
sizes hold the same current work (the same queued tickets, the same newest
page, the same 20 unflagged overdue obligations and 5 due webhook deliveries
for the sweeps) and differ only in history. Each is ``VACUUM ANALYZE``d (as
autovacuum would), then every figure is run twice untimed and ``-r`` times
timed on each, alternating, and the median printed:

- API, through Django's test ``Client`` with a staff user's bearer key
  (server time only, no network): the first page of ``GET /api/v1/tickets``,
  pages filtered by endpoint, by state (failed; queued), by both (succeeded), a ticket,
  its events, the 50-node lineage;
- console, the same client logged in as that staff user: the dashboard and
  the ticket list (unfiltered; state=failed);
- one pass of each sweep: ``runtime.turns.sweep_budgets``,
  ``sweep_lost_dispatches``, ``tickets.delivery.sweep_due_deliveries``,
  ``tickets.obligations.sweep_overdue`` (its first pass flags the 20 due
  obligations; later passes have nothing to do) and
  ``tickets.callbacks.retry_pending_callbacks`` (the two run by
  ``tickets.sweep_obligations``).

The growth ratio is the 1M time over the 10k time (target <= 1.5). For every
figure over the target the statements of one run at the large size are
timed and the slowest SELECT is shown with ``EXPLAIN (ANALYZE, BUFFERS)``.
Finally bytes per ticket from ``pg_total_relation_size``/``pg_relation_size``,
and again for tickets with a large (16 KB) result.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

DB_NAME = "claimcheck_bench_scale"  # the large ledger
SMALL_DB = "claimcheck_bench_scale_small"
WALL_S = 4500  # seeding a million tickets takes 10-30 min on this shared machine
FIRST_PASS = "sweep_overdue, first pass (20 due)"
FIGURES = [
    "api list, first page",
    "api list, by endpoint",
    "api list, by state (failed)",
    "api list, by state (queued)",
    "api list, by endpoint+state",
    "api ticket",
    "api ticket events",
    "api lineage (50 nodes)",
    "console dashboard",
    "console ticket list",
    "console ticket list, failed",
    "sweep_budgets",
    "sweep_lost_dispatches",
    "sweep_due_deliveries",
    FIRST_PASS,
    "sweep_overdue, idle pass",
    "retry_pending_callbacks",
]
ENDPOINTS = 20
QUEUED = 100
LINEAGE = 50
BATCH = 100_000
STEP_S = 2.5  # seconds between two tickets: 1M tickets are about 29 days
GROWTH_TARGET = 1.5
BYTES_TARGET = 2048
# Figures whose slowest SELECT is shown with its plan at the large size even
# when within the growth target (bench/console.py: the searches).
EXPLAIN_ALWAYS: list[str] = []

UUID7 = """
CREATE FUNCTION bench_uuid7(ts timestamptz, seed text) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    -- 48 bits of Unix milliseconds, version 7, variant 10, the rest from md5(seed).
    SELECT (lpad(to_hex(floor(extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7'
            || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid
    FROM md5(seed) AS h
$$
"""

# One row per ticket g (g = 1 is the newest), everything the inserts need.
STAGE = """
CREATE TEMP TABLE s ON COMMIT DROP AS
SELECT g, created, state, webhook, unacked, endpoint_id, user_id,
    bench_uuid7(created, %(tag)s || 't' || g) AS id,
    bench_uuid7(created + interval '100 ms', %(tag)s || 'u' || g) AS turn_id,
    bench_uuid7(created + interval '300 ms', %(tag)s || 'd' || g) AS delivery_id,
    %(tag)s || 'req-' || g AS dedupe_key,
    jsonb_build_object(
        'key', %(tag)s || 'req-' || g,
        'text', 'Summarise the open items for team ' || (g %% 50)
                || ' and draft the weekly brief for their channel.',
        'options', jsonb_build_object('tone', 'plain', 'max_words', 300)) AS input,
    %(seq_base)s::bigint - g AS seq,
    jsonb_build_object('delivery_opened', jsonb_build_object(
        'mode', CASE WHEN webhook THEN 'webhook' ELSE 'pull' END, 'state', 'pending')) AS opened
FROM (
    SELECT g, created, webhook,
        CASE WHEN g <= %(queued)s THEN 'queued'
             WHEN g %% 100 < 4 THEN 'failed'
             WHEN g %% 100 = 4 THEN 'cancelled'
             ELSE 'succeeded' END AS state,
        -- a pull delivery (g odd) nobody acknowledged: the obligation stays open
        (g %% 200 = 7 AND g > %(queued)s) AS unacked,
        (%(endpoints)s::bigint[])[1 + g %% cardinality(%(endpoints)s::bigint[])] AS endpoint_id,
        (%(users)s::int[])[1 + g %% cardinality(%(users)s::int[])] AS user_id
    FROM (
        SELECT g, %(t0)s::timestamptz - g * %(step)s * interval '1 second' AS created,
            (g %% 2 = 0) AS webhook
        FROM generate_series(%(a)s::bigint, %(b)s::bigint) AS g
    ) t
) u
"""

INSERTS = [
    # The ticket. Finished ones have their turn; the newest queued ones none.
    """
    INSERT INTO tickets_ticket (
        id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state, result,
        error, artifacts, requester, submitted_by_id, callback_state, delivery_state,
        needs_dispatch, obligation_state, obligation_due_at, obligation_overdue,
        obligation_note, created_at, updated_at, finished_at, turn_id)
    SELECT id, endpoint_id, dedupe_key, md5(dedupe_key) || md5(id::text), input,
        replace(id::text, '-', ''), 0, state,
        CASE WHEN state = 'succeeded' THEN
            CASE WHEN %(result_kb)s > 0
                 THEN jsonb_build_object('echo', input, 'text', bench_text(g, %(result_kb)s))
                 ELSE jsonb_build_object('echo', input) END END,
        CASE WHEN state = 'failed' THEN jsonb_build_object(
            'type', 'RuntimeError', 'message', 'demo.fail raised on purpose') END,
        '[]'::jsonb,
        CASE WHEN webhook THEN jsonb_build_object(
            'webhook_url', 'https://hooks.example.com/claimcheck/' || (g %% 50))
            ELSE '{}'::jsonb END,
        user_id, 'none',
        CASE WHEN state = 'queued' THEN 'none' WHEN unacked THEN 'pending' ELSE 'delivered' END,
        false,
        CASE WHEN state = 'queued' OR unacked THEN 'open' ELSE 'closed' END,
        CASE WHEN state = 'queued' OR unacked THEN created + interval '1 hour' END,
        unacked AND created + interval '1 hour' < %(t0)s::timestamptz,
        '', created, created + interval '1 second',
        CASE WHEN state <> 'queued' THEN created + interval '200 ms' END,
        CASE WHEN state IN ('succeeded', 'failed') THEN turn_id END
    FROM s ORDER BY g DESC
    """,
    """
    INSERT INTO runtime_turn (
        id, endpoint_id, ticket_id, seq, state, runner_kind, celery_task_id, worker,
        started_at, heartbeat_at, deadline_at, interrupt_reason, ended_at)
    SELECT turn_id, endpoint_id, id, seq,
        CASE WHEN state = 'succeeded' THEN 'completed' ELSE 'failed' END, 'python',
        md5('c' || g)::uuid::text, '{"host": "worker-1", "pid": 4242}'::jsonb,
        created + interval '100 ms', created + interval '100 ms',
        created + interval '300 s', '', created + interval '190 ms'
    FROM s WHERE state IN ('succeeded', 'failed') ORDER BY g DESC
    """,
    """
    INSERT INTO runtime_contextentry (
        endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
    SELECT s.endpoint_id, s.turn_id, s.id, s.seq, s.input, t.result, '[]'::jsonb,
        s.created + interval '190 ms'
    FROM s JOIN tickets_ticket t ON t.id = s.id WHERE s.state = 'succeeded' ORDER BY s.g DESC
    """,
    """
    INSERT INTO tickets_delivery (
        id, ticket_id, mode, url, attempts, next_attempt_at, last_error, delivered_at,
        created_at)
    SELECT delivery_id, id, CASE WHEN webhook THEN 'webhook' ELSE 'pull' END,
        CASE WHEN webhook THEN 'https://hooks.example.com/claimcheck/' || (g %% 50) ELSE '' END,
        CASE WHEN webhook THEN 1 ELSE 0 END, NULL, '',
        CASE WHEN unacked THEN NULL ELSE created + interval '400 ms' END,
        created + interval '300 ms'
    FROM s WHERE state <> 'queued' ORDER BY g DESC
    """,
    """
    INSERT INTO tickets_deliveryattempt (
        delivery_id, number, at, status_code, latency_ms, error)
    SELECT delivery_id, 1, created + interval '390 ms', 200, 35.0, ''
    FROM s WHERE state <> 'queued' AND webhook ORDER BY g DESC
    """,
    """
    INSERT INTO tickets_trace (id, tickets, max_depth, flagged, created_at)
    SELECT replace(id::text, '-', ''), 1, 0, false, created FROM s ORDER BY g DESC
    """,
    # The events, oldest ticket first so ids grow with time within the batch.
    """
    INSERT INTO tickets_ticketevent (
        ticket_id, kind, from_state, to_state, actor, detail, at, turn_id)
    SELECT s.id, e.kind, e.from_state, e.to_state, e.actor, e.detail, e.at, e.turn_id
    FROM s CROSS JOIN LATERAL (VALUES
        (1, true, 'admitted', '', 'queued', 'user:bench-staff', '{}'::jsonb, s.created,
            NULL::uuid),
        (2, s.state IN ('succeeded', 'failed'), 'turn_started', 'queued', 'running',
            'worker:worker-1:4242',
            jsonb_build_object('seq', s.seq),
            s.created + interval '100 ms', s.turn_id),
        -- The terminal event records the outcome's digest (a repeated finish
        -- recognises itself by it) and the delivery it opened.
        (3, s.state IN ('succeeded', 'failed'),
            CASE WHEN s.state = 'succeeded' THEN 'turn_completed' ELSE 'turn_failed' END,
            'running', s.state, 'turn:' || s.seq || ':worker',
            jsonb_build_object('outcome_sha256', md5(s.id::text) || md5(s.turn_id::text))
                || s.opened,
            s.created + interval '190 ms', s.turn_id),
        (3, s.state = 'cancelled', 'cancelled', 'queued', 'cancelled', 'user:bench-staff',
            s.opened, s.created + interval '150 ms', NULL::uuid),
        (5, s.state <> 'queued' AND NOT s.unacked,
            CASE WHEN s.webhook THEN 'delivered' ELSE 'delivery_acknowledged' END, '', '',
            CASE WHEN s.webhook THEN 'delivery' ELSE 'user:bench-staff' END,
            CASE WHEN s.webhook THEN jsonb_build_object(
                'delivery', s.delivery_id, 'attempt', 1, 'status_code', 200)
                ELSE jsonb_build_object('delivery', s.delivery_id) END,
            s.created + interval '400 ms', NULL::uuid)
    ) AS e(n, applies, kind, from_state, to_state, actor, detail, at, turn_id)
    WHERE e.applies
    ORDER BY s.g DESC, e.n
    """,
]

# Prose-like filler for the large result: words from a small vocabulary, so it
# compresses about as well as model output does (PostgreSQL's TOAST, pglz).
TEXT = """
CREATE FUNCTION bench_text(g bigint, kb int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT left(string_agg(w[1 + (get_byte(decode(md5(g || ':' || i), 'hex'), 0) % 64)],
                           ' '), kb * 1024)
    FROM generate_series(1, kb * 200) AS i,
         (SELECT regexp_split_to_array(
            'the of and to in is that for it as with was on be by this are from at or an '
            'not have which has but were their all its more one also can these been than '
            'other into such some when would only what about there after over them then '
            'team brief weekly open items draft channel summary risk owner due status plan',
            ' ') AS w) AS words
$$
"""

LINEAGE_SQL = """
WITH root AS (
    SELECT bench_uuid7(%(t0)s::timestamptz - interval '30 minutes', 'lineage-root') AS id,
           %(t0)s::timestamptz - interval '30 minutes' AS created
), nodes AS (
    SELECT n, CASE WHEN n = 0 THEN root.id
                   ELSE bench_uuid7(root.created + n * interval '1 second', 'lineage-' || n) END
               AS id,
           root.created + n * interval '1 second' AS created, root.id AS root_id
    FROM root, generate_series(0, %(n)s - 1) AS n
), ins AS (
    INSERT INTO tickets_ticket (
        id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
        result, artifacts, requester, submitted_by_id, callback_state, delivery_state,
        needs_dispatch, obligation_state, obligation_overdue, obligation_note, created_at,
        updated_at, finished_at, return_to_id)
    SELECT id, %(endpoint)s, CASE WHEN n = 0 THEN 'lineage-root' END,
        md5(id::text) || md5(id::text),
        jsonb_build_object('child', n), CASE WHEN n > 0 THEN root_id END, 'lineage-trace',
        CASE WHEN n = 0 THEN 0 ELSE 1 END, 'succeeded', jsonb_build_object('ok', n),
        '[]'::jsonb, '{}'::jsonb, %(user)s,
        CASE WHEN n = 0 THEN 'none' ELSE 'recorded' END,
        CASE WHEN n = 0 THEN 'delivered' ELSE 'none' END, false,
        CASE WHEN n = 0 THEN 'closed' ELSE 'none' END, false, '', created, created,
        created + interval '1 second', CASE WHEN n > 0 THEN %(endpoint)s END
    FROM nodes
    RETURNING id, created_at
)
INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
SELECT id, 'admitted', '', 'queued', 'user:bench-staff', '{}'::jsonb, created_at FROM ins
"""


# --- seeding ------------------------------------------------------------------------------------


def seed(
    conn,
    *,
    first: int,
    last: int,
    ctx: dict,
    tag: str = "",
    result_kb: int = 0,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Tickets g = first..last (g = 1 is the newest), in batches, oldest
    first and in time order within a batch: as a ledger grows, at the right
    edge of its time-ordered indexes (inserting history behind newer rows
    would split index pages in the middle and leave them half full)."""
    started = time.perf_counter()
    for b in range(last, first - 1, -BATCH):
        a = max(b - BATCH + 1, first)
        with conn.transaction():
            params = {**ctx, "a": a, "b": b, "tag": tag, "result_kb": result_kb}
            conn.execute(STAGE, params)
            for sql in INSERTS:
                conn.execute(sql, params)
        if progress:
            progress(f"seeded tickets {a:,}..{b:,}")
    return time.perf_counter() - started


# The seeded tickets, not the large-result ones a finished run added.
COUNT_SEEDED = (
    "SELECT count(*) FROM tickets_ticket t JOIN endpoints_endpoint e ON e.id = t.endpoint_id "
    "WHERE e.address <> 'bench.scale-large'"
)


def _seeded(name: str, tickets: int) -> bool:
    """Whether ``name`` holds a seeded ledger of ``tickets`` tickets (what a
    ``--keep`` run leaves), for ``--reuse``."""
    import psycopg

    try:
        with psycopg.connect(f"{benchlib.PG_SERVER}/{name}") as conn:
            return conn.execute(COUNT_SEEDED).fetchone()[0] == tickets
    except psycopg.Error:
        return False


def vacuum_analyze(conn) -> None:
    conn.execute("VACUUM ANALYZE")


def prepare_sweep_work(conn, *, shared_since, t0) -> int:
    """The same work for the sweeps at both sizes: the 20 newest overdue
    obligations unflagged (the first ``sweep_overdue`` pass flags them) and
    the 5 newest webhook deliveries due. A bench fixture written by SQL,
    like the seed."""
    unflagged = conn.execute(
        """
        UPDATE tickets_ticket SET obligation_overdue = false WHERE id IN (
            SELECT id FROM tickets_ticket
            WHERE obligation_state = 'open' AND obligation_due_at < %s
              AND created_at >= %s
            ORDER BY obligation_due_at DESC LIMIT 20)
        """,
        # Due at the parent's t0, not now: the two children prepare minutes
        # apart, and must pick the same 20.
        (t0, shared_since),
    ).rowcount
    conn.execute(
        """
        UPDATE tickets_delivery SET next_attempt_at = now() - interval '1 minute'
        WHERE id IN (SELECT id FROM tickets_delivery WHERE mode = 'webhook'
                     AND created_at >= %s ORDER BY created_at DESC LIMIT 5)
        """,
        (shared_since,),
    )
    return unflagged  # 20 from 10,000 tickets on; fewer with a smaller --small


# --- measuring ----------------------------------------------------------------------------------


class StatementClock:
    """Django execute wrapper: each statement's SQL and seconds."""

    def __init__(self):
        self.statements: list[tuple[float, str]] = []

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            seconds = time.perf_counter() - started
            if not many:  # the statement as sent (Django binds parameters client-side)
                ops = context["connection"].ops
                sql = ops.last_executed_query(context["cursor"].cursor, sql, params)
            self.statements.append((seconds, sql))


@contextmanager
def quiet_logs():
    import logging

    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def figures(ctx: dict) -> dict[str, Callable[[], object]]:
    """What is timed: name -> a callable doing it once."""
    from django.test import Client

    from runtime import turns
    from tickets import callbacks, delivery, obligations

    api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {ctx['api_key']}")
    console = Client(HTTP_HOST="127.0.0.1")
    console.force_login(ctx["staff"])
    ep = ctx["endpoint_address"]

    def get(client, url: str):
        def call():
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code, response.content[:300])
            return response

        return call

    return {
        "api list, first page": get(api, "/api/v1/tickets"),
        "api list, by endpoint": get(api, f"/api/v1/tickets?endpoint={ep}"),
        "api list, by state (failed)": get(api, "/api/v1/tickets?state=failed"),
        "api list, by state (queued)": get(api, "/api/v1/tickets?state=queued"),
        "api list, by endpoint+state": get(api, f"/api/v1/tickets?endpoint={ep}&state=succeeded"),
        "api ticket": get(api, f"/api/v1/tickets/{ctx['ticket_id']}"),
        "api ticket events": get(api, f"/api/v1/tickets/{ctx['ticket_id']}/events"),
        "api lineage (50 nodes)": get(api, f"/api/v1/tickets/{ctx['lineage_root']}/lineage"),
        "console dashboard": get(console, "/"),
        "console ticket list": get(console, "/tickets/"),
        "console ticket list, failed": get(console, "/tickets/?state=failed"),
        "sweep_budgets": turns.sweep_budgets,
        "sweep_lost_dispatches": turns.sweep_lost_dispatches,
        "sweep_due_deliveries": delivery.sweep_due_deliveries,
        FIRST_PASS: obligations.sweep_overdue,
        "sweep_overdue, idle pass": obligations.sweep_overdue,
        "retry_pending_callbacks": callbacks.retry_pending_callbacks,
    }


def explain(conn, sql: str) -> str:
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql).fetchall()
    return "\n".join("      " + r[0] for r in rows)


def _p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile (of 15 runs: the 15th, the slowest)."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


# --- sizes --------------------------------------------------------------------------------------

TABLES = [
    "tickets_ticket",
    "tickets_ticketevent",
    "runtime_turn",
    "runtime_contextentry",
    "tickets_delivery",
    "tickets_deliveryattempt",
    "tickets_trace",
]


def sizes(conn) -> dict[str, int]:
    out = {}
    for table in TABLES:
        heap, toast, indexes, total = conn.execute(
            """
            SELECT pg_relation_size(c.oid),
                   COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0),
                   pg_indexes_size(c.oid), pg_total_relation_size(c.oid)
            FROM pg_class c WHERE c.oid = %s::regclass
            """,
            (table,),
        ).fetchone()
        out[f"{table}.heap"] = heap
        out[f"{table}.toast"] = toast
        out[f"{table}.indexes"] = indexes
        out[f"{table}.total"] = total
    return out


def index_sizes(conn) -> dict[str, int]:
    """Each index of the ticket and event tables: what the indexes cost."""
    rows = conn.execute(
        """
        SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
        FROM pg_index i
        WHERE i.indrelid IN ('tickets_ticket'::regclass, 'tickets_ticketevent'::regclass)
        ORDER BY 2 DESC
        """
    ).fetchall()
    return dict(rows)


def per_ticket(sz: dict[str, int], tickets: int) -> dict[str, float]:
    t = "tickets_ticket"
    row = (sz[f"{t}.heap"] + sz[f"{t}.toast"]) / tickets
    idx = sz[f"{t}.indexes"] / tickets
    events = sz["tickets_ticketevent.total"] / tickets
    others = sum(sz[f"{x}.total"] for x in TABLES[2:]) / tickets
    return {
        "row": row,
        "indexes": idx,
        "events": events,
        "ledger": row + idx + events,
        "turn+context+delivery+trace": others,
        "all": row + idx + events + others,
    }


def print_bytes(label: str, b: dict[str, float]) -> None:
    print(
        f"  {label}: row {b['row']:.0f} + indexes {b['indexes']:.0f} + events {b['events']:.0f}"
        f" = {b['ledger']:.0f} B per ticket (target <= {BYTES_TARGET}); with its turn, context"
        f" entry, delivery and trace rows {b['all']:.0f} B"
    )


# --- one database: a child process that seeds it and runs what it is told ----------------------


def reply(payload: dict) -> None:
    sys.stdout.write("SCALE " + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def progress(label: str, text: str) -> None:
    print(f"  [{label}] {text}", file=sys.stderr, flush=True)


def run_once(calls: dict, name: str, *, capture: bool) -> dict:
    from django.db import connection

    clock = StatementClock()
    with quiet_logs():
        if capture:
            with connection.execute_wrapper(clock):
                started = time.perf_counter()
                result = calls[name]()
                seconds = time.perf_counter() - started
        else:
            started = time.perf_counter()
            result = calls[name]()
            seconds = time.perf_counter() - started
    if name.startswith(("sweep_", "retry_")):
        benchlib.flush_broker()  # what the sweep published; nothing consumes it
    out: dict = {"s": seconds, "statements": len(clock.statements)}
    if name == FIRST_PASS:
        out["flagged"] = len(result)
    if capture:
        selects = [x for x in clock.statements if x[1].lstrip().upper().startswith("SELECT")]
        out["selects"] = sorted(selects, key=lambda x: x[0], reverse=True)[:3]
    return out


def child(args) -> None:
    """Seed ``args.tickets`` tickets into ``args.db``, report ready, then run
    the parent's commands (JSON lines on stdin) until ``quit``."""
    label, tickets = args.child, args.tickets
    # SIGTERM from the parent: leave through ``finally``, which drops the database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    benchlib.start_wall_clock(WALL_S)
    benchlib.use_database(args.db)
    reuse = args.reuse and _seeded(benchlib.DB_NAME, tickets)
    if not reuse:
        benchlib.recreate_database()
    benchlib.setup_django()

    import psycopg
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.keys import create_api_key
    from endpoints.models import Endpoint
    from endpoints.services import create_endpoint

    runner = {"kind": "python", "path": "runtime.demo.echo"}
    if reuse:  # what a --keep run left: its endpoints and users, a new key
        endpoints = list(
            Endpoint.objects.filter(address__startswith="bench.scale-")
            .exclude(address="bench.scale-large")
            .order_by("address")
            .values_list("id", flat=True)
        )
    else:
        endpoints = [
            create_endpoint(address=f"bench.scale-{i:02d}", runner=runner).id
            for i in range(ENDPOINTS)
        ]
    _, api_key = create_api_key(username="bench-staff", staff=True)
    create_api_key(username="bench-user")
    users = list(get_user_model().objects.order_by("id").values_list("id", flat=True))
    staff = get_user_model().objects.get(username="bench-staff")
    connection.close()

    db = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    try:
        if not reuse:
            db.execute(UUID7)
            db.execute(TEXT)
        seed_ctx = {"t0": args.t0, "step": STEP_S, "queued": QUEUED, "endpoints": endpoints,
                    "users": users, "seq_base": args.seq_base}  # fmt: skip
        # The large ledger's older history first, then the newest tickets and
        # the lineage, which both databases hold alike.
        started = time.perf_counter()
        due = 0
        if reuse:
            progress(label, f"reusing {benchlib.DB_NAME}, as a --keep run left it")
        else:
            if tickets > args.small:
                seed(db, first=args.small - LINEAGE + 1, last=tickets - LINEAGE, ctx=seed_ctx,
                     progress=lambda t: progress(label, t))  # fmt: skip
            seed(db, first=1, last=args.small - LINEAGE, ctx=seed_ctx)
            db.execute(LINEAGE_SQL, {"t0": args.t0, "n": LINEAGE, "endpoint": endpoints[0],
                                     "user": users[0]})  # fmt: skip
            db.execute("INSERT INTO tickets_trace VALUES ('lineage-trace', %s, 1, false, now())",
                       (LINEAGE,))  # fmt: skip
            # Only among the tickets both ledgers hold: the same work in both.
            shared_since = db.execute(
                "SELECT %s::timestamptz - %s * interval '1 second'",
                (args.t0, (args.small - LINEAGE) * STEP_S),
            ).fetchone()[0]
            due = prepare_sweep_work(db, shared_since=shared_since, t0=args.t0)
            vacuum_analyze(db)
        seed_s = time.perf_counter() - started
        count = db.execute(COUNT_SEEDED).fetchone()[0]
        assert count == tickets, f"{count} tickets, expected {tickets}"
        ctx = {
            "api_key": api_key,
            "staff": staff,
            "endpoint_address": "bench.scale-03",
            # A finished webhook ticket: its payload reads its turn and delivery.
            # Among the seeded ones: the large-results tickets a --keep run
            # added (on bench.scale-large, the newest) moved a --reuse run's
            # pick in the large ledger only ("the ledgers differ").
            "ticket_id": db.execute(
                "SELECT t.id FROM tickets_ticket t JOIN endpoints_endpoint e "
                "ON e.id = t.endpoint_id WHERE e.address <> 'bench.scale-large' "
                "AND t.state = 'succeeded' AND t.delivery_state = 'delivered' "
                "AND t.requester ? 'webhook_url' ORDER BY t.id DESC LIMIT 1 OFFSET 500"
            ).fetchone()[0],
            "lineage_root": db.execute(
                "SELECT id FROM tickets_ticket WHERE trace_id = 'lineage-trace' "
                "AND parent_id IS NULL"
            ).fetchone()[0],
        }
        calls = figures(ctx)
        assert list(calls) == FIGURES, "figures() and FIGURES differ"
        progress(label, f"{count:,} tickets seeded in {seed_s:.0f} s; ready")
        reply({"ready": True, "count": count, "due": due, "seed_s": seed_s,
               "bytes": per_ticket(sizes(db), count), "ticket": ctx["ticket_id"],
               "index_bytes": {k: v / count for k, v in index_sizes(db).items()}})  # fmt: skip
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "run":
                reply(run_once(calls, cmd["figure"], capture=cmd.get("capture", False)))
            elif cmd["cmd"] == "explain":
                reply({"plan": explain(db, cmd["sql"])})
            elif cmd["cmd"] == "large_results" and reuse:
                reply({"bytes": None})  # measured by the run that seeded it
            elif cmd["cmd"] == "large_results":
                # Tickets with a 16 KB result on an endpoint of their own: the
                # growth of every relation per ticket.
                before = sizes(db)
                large_ep = create_endpoint(address="bench.scale-large", runner=runner).id
                connection.close()
                seed(db, first=1, last=cmd["n"], tag="large-", result_kb=16,
                     ctx={**seed_ctx, "endpoints": [large_ep], "queued": 0})  # fmt: skip
                vacuum_analyze(db)
                after = sizes(db)
                reply({"bytes": per_ticket({k: after[k] - before[k] for k in after}, cmd["n"])})
            elif cmd["cmd"] == "quit":
                break
    finally:
        db.close()
        benchlib.flush_broker()
        connection.close()
        if not args.keep:
            benchlib.drop_database()


class Child:
    """The parent's handle on one child process."""

    def __init__(self, label: str, db: str, tickets: int, args, t0: str):
        self.label = label
        argv = [
            sys.executable, str(Path(__file__).resolve()), "--child", label, "--db", db,
            "--tickets", str(tickets), "--small", str(args.small), "--t0", t0,
            "--seq-base", str(args.large + 10),
        ]  # fmt: skip
        if args.keep:
            argv.append("--keep")
        if args.reuse:
            argv.append("--reuse")
        self.proc = subprocess.Popen(
            argv,
            cwd=benchlib.ROOT,
            env=benchlib.bench_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("SCALE "):
                return json.loads(line.removeprefix("SCALE "))
        raise RuntimeError(f"the {self.label} child exited ({self.proc.wait()})")

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()


# --- main: two databases measured in turn --------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000, help="tickets in the small ledger")
    parser.add_argument("--large", type=int, default=1_000_000, help="tickets in the large one")
    parser.add_argument("-r", "--repeats", type=int, default=15, help="timed runs per figure")
    parser.add_argument("--large-results", type=int, default=5_000,
                        help="tickets seeded with a 16 KB result for the bytes figure")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the two databases")
    parser.add_argument("--reuse", action="store_true",
                        help="time the ledgers a --keep run left, if they are there (no seeding; "
                        "the sweeps' figures then find no work)")  # fmt: skip
    # The child processes (one per database): internal.
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--tickets", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--t0", help=argparse.SUPPRESS)
    parser.add_argument("--seq-base", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.small = max(1_000, min(args.small, 100_000))
    args.large = max(args.small * 2, min(args.large, 2_000_000))
    if args.child:
        child(args)
        return
    repeats = max(3, min(args.repeats, 50))
    lr = max(100, min(args.large_results, 50_000))
    benchlib.start_wall_clock(WALL_S + 300)
    benchlib.flush_broker()

    from datetime import UTC, datetime

    t0 = datetime.now(UTC).isoformat()
    kids = {
        "small": Child("small", SMALL_DB, args.small, args, t0),
        "large": Child("large", DB_NAME, args.large, args, t0),
    }
    ready = {}
    samples: dict[str, dict[str, list[float]]] = {f: {"small": [], "large": []} for f in FIGURES}
    captured: dict[str, dict[str, dict]] = {}
    plans: dict[str, tuple[float, str, str]] = {}
    try:
        print(f"seeding {args.small:,} and {args.large:,} tickets (two databases)", flush=True)
        ready = {k: kid.read() for k, kid in kids.items()}
        assert ready["small"]["ticket"] == ready["large"]["ticket"], "the ledgers differ"
        print("timing, the two ledgers in turn", flush=True)
        for name in FIGURES:
            if name == FIRST_PASS:
                # One pass each: the one with the due obligations to flag.
                for k, kid in kids.items():
                    got = kid.ask(cmd="run", figure=name, capture=True)
                    # Obligations that fell due since the set-up count too: the
                    # same ones in both ledgers.
                    assert got["flagged"] >= ready[k]["due"], (k, got["flagged"], ready[k]["due"])
                    samples[name][k].append(got["s"])
                    captured.setdefault(name, {})[k] = got
                flagged = {k: captured[name][k]["flagged"] for k in kids}
                if flagged["small"] != flagged["large"]:  # one fell due between the two calls
                    print(f"  note: the first overdue sweep flagged {flagged}", flush=True)
                continue
            for _ in range(2):
                for kid in kids.values():
                    kid.ask(cmd="run", figure=name)
            for i in range(repeats):
                order = ("small", "large") if i % 2 == 0 else ("large", "small")
                for k in order:
                    samples[name][k].append(kids[k].ask(cmd="run", figure=name)["s"])
            captured[name] = {k: kid.ask(cmd="run", figure=name, capture=True)
                              for k, kid in kids.items()}  # fmt: skip
        med = {f: {k: statistics.median(v) * 1e3 for k, v in samples[f].items()} for f in FIGURES}
        p95 = {f: {k: _p95(v) * 1e3 for k, v in samples[f].items()} for f in FIGURES}
        for name in FIGURES:
            if med[name]["large"] / med[name]["small"] > GROWTH_TARGET or name in EXPLAIN_ALWAYS:
                selects = captured[name]["large"]["selects"]
                if selects:
                    seconds, sql = selects[0]
                    plans[name] = (seconds, sql, kids["large"].ask(cmd="explain", sql=sql)["plan"])
        print(f"seeding {lr:,} tickets with a 16 KB result", flush=True)
        large_bytes = kids["large"].ask(cmd="large_results", n=lr)["bytes"]
    finally:
        for kid in kids.values():
            kid.close()
        benchlib.flush_broker()

    small, large = args.small, args.large
    print(f"\nServer time, median of {repeats} (the first overdue sweep: one pass), ms:")
    print(f"  {'figure':<38} {small:>9,} {large:>10,}  growth  statements  p95 small/large")
    summary: dict = {"bench": "scale", "small": small, "large": large, "repeats": repeats,
                     "figures": {}}  # fmt: skip
    for name in FIGURES:
        a, b = med[name]["small"], med[name]["large"]
        growth = b / a
        statements = [captured[name][k]["statements"] for k in ("small", "large")]
        flag = "" if growth <= GROWTH_TARGET else "  MISS"
        tail = f"{p95[name]['small']:.2f}/{p95[name]['large']:.2f}"
        print(
            f"  {name:<38} {a:9.2f} {b:10.2f}  {growth:5.2f}x  "
            f"{statements[0]}/{statements[1]:<9} {tail}{flag}"
        )
        summary["figures"][name] = {
            "ms": [round(a, 3), round(b, 3)],
            "p95_ms": [round(p95[name]["small"], 3), round(p95[name]["large"], 3)],
            "growth": round(growth, 3),
            "statements": statements,
        }
    print(f"  (seeding took {ready['small']['seed_s']:.0f} s and {ready['large']['seed_s']:.0f} s)")
    print("\nBytes per ticket (pg_relation_size of heap + TOAST, pg_indexes_size, events total):")
    print_bytes(f"{small:,} tickets", ready["small"]["bytes"])
    print_bytes(f"{large:,} tickets", ready["large"]["bytes"])
    if large_bytes is not None:
        label = f"{lr:,} tickets with a 16 KB result (growth of each relation)"
        print_bytes(label, large_bytes)
    print(f"  indexes of tickets and events at {large:,} tickets, bytes per ticket:")
    for name, b in ready["large"]["index_bytes"].items():
        print(f"    {name:<48} {b:6.1f}")
    summary["bytes_per_ticket"] = {
        str(small): {k: round(v) for k, v in ready["small"]["bytes"].items()},
        str(large): {k: round(v) for k, v in ready["large"]["bytes"].items()},
        "large_result": {k: round(v) for k, v in (large_bytes or {}).items()},
        "indexes_at_large": {k: round(v, 1) for k, v in ready["large"]["index_bytes"].items()},
    }
    if plans:
        print(
            f"\nOver the {GROWTH_TARGET}x target (or always shown): the slowest SELECT at "
            f"{large:,} tickets"
        )
        for name, (seconds, sql, plan) in plans.items():
            print(f"\n  {name}: {seconds * 1e3:.2f} ms\n    {' '.join(sql.split())[:600]}")
            print(plan)
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
