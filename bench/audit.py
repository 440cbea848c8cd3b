"""How long ``manage.py audit_ledger`` takes on a big ledger.

Seeds a consistent ledger with generate_series (default 1,000,000 tickets on
1,000 endpoints: one turn, three transition events and one context entry per
ticket; one ticket in 20 failed), ANALYZEs it, then times the whole audit
and ``--since`` over the newest 1%, and checks that the seeded ledger is
clean. Owns the database ``claimcheck_audit_bench`` on 127.0.0.1 (dropped
at the start and, without ``--keep``, at the end).

    .venv/bin/python bench/audit.py [-n 1000000] [--endpoints 1000] [--reps 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
DB_NAME = "claimcheck_audit_bench"
DATABASE_URL = f"{PG_SERVER}/{DB_NAME}"

# Ticket g (1..n) runs on endpoint (g % E) + 1 as that endpoint's turn
# number ceil(g / E); turns start 10 ms apart and last 5 ms, so the turns of
# an endpoint never overlap. Ids are UUIDv7-shaped from the start time, so
# ``--since`` selects the newest tickets through the primary key.
SEED = """
CREATE TEMP TABLE g AS
SELECT g,
       (g %% %(e)s) + 1 AS endpoint_id,
       (g - 1) / %(e)s + 1 AS seq,
       %(base)s::timestamptz + g * interval '10 milliseconds' AS started_at,
       lpad(to_hex(%(base_ms)s + g * 10), 12, '0') AS ms_hex,
       lpad(to_hex(g), 12, '0') AS g_hex,
       g %% 20 = 0 AS failed
FROM generate_series(1, %(n)s) AS g;

INSERT INTO endpoints_endpoint (id, address, runner, turn_budget_s, interrupt_grace_s,
    heartbeat_timeout_s, requires_approval, busy_policy, state, turn_seq, created_at, updated_at)
SELECT e, 'bench.audit-' || e, '{"kind": "python", "path": "runtime.demo.echo"}', 300, 10, 30,
    false, 'enqueue', 'available', 0, %(base)s, %(base)s
FROM generate_series(1, %(e)s) AS e;
SELECT setval(pg_get_serial_sequence('endpoints_endpoint', 'id'), %(e)s);
INSERT INTO endpoints_endpointgeneration (
    endpoint_id, number, config, changes, actor, reason, first_seq, at)
SELECT id, 1, jsonb_build_object('runner', runner, 'turn_budget_s', turn_budget_s,
    'interrupt_grace_s', interrupt_grace_s, 'heartbeat_timeout_s', heartbeat_timeout_s,
    'busy_policy', busy_policy, 'requires_approval', requires_approval, 'notes', notes),
    '{}'::jsonb, 'bench', 'bench', 1, %(base)s
FROM endpoints_endpoint;

INSERT INTO tickets_ticket (id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth,
    state, result, error, artifacts, turn_id, requester, callback_state, delivery_state,
    needs_dispatch, obligation_state, obligation_overdue, obligation_note, created_at,
    updated_at, finished_at)
SELECT (ms_hex || '7000' || '8000' || g_hex)::uuid, endpoint_id, 'k' || g, md5(g::text),
    jsonb_build_object('n', g), md5(g::text), 0,
    CASE WHEN failed THEN 'failed' ELSE 'succeeded' END,
    CASE WHEN failed THEN NULL ELSE jsonb_build_object('echo', g) END,
    CASE WHEN failed THEN '{"code": "runner_error"}'::jsonb END,
    '[]', (ms_hex || '7000' || '9000' || g_hex)::uuid, '{}', 'none', 'none', false, 'none',
    false, '', started_at, started_at + interval '5 milliseconds',
    started_at + interval '5 milliseconds'
FROM g;

INSERT INTO runtime_turn (id, endpoint_id, ticket_id, seq, state, runner_kind,
    celery_task_id, worker, started_at, heartbeat_at, deadline_at, interrupt_reason, ended_at)
SELECT (ms_hex || '7000' || '9000' || g_hex)::uuid, endpoint_id,
    (ms_hex || '7000' || '8000' || g_hex)::uuid, seq,
    CASE WHEN failed THEN 'failed' ELSE 'completed' END, 'python', '', '{}', started_at,
    started_at, started_at + interval '300 seconds', '', started_at + interval '5 milliseconds'
FROM g;

INSERT INTO runtime_contextentry (endpoint_id, turn_id, ticket_id, seq, input, result,
    artifacts, created_at)
SELECT endpoint_id, (ms_hex || '7000' || '9000' || g_hex)::uuid,
    (ms_hex || '7000' || '8000' || g_hex)::uuid, seq, jsonb_build_object('n', g),
    jsonb_build_object('echo', g), '[]', started_at
FROM g;

INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, turn_id,
    detail, at)
SELECT (ms_hex || '7000' || '8000' || g_hex)::uuid, ev.kind, ev.from_state, ev.to_state,
    'bench', CASE WHEN ev.kind = 'admitted' THEN NULL
                  ELSE (ms_hex || '7000' || '9000' || g_hex)::uuid END,
    '{}', started_at
FROM g CROSS JOIN LATERAL (VALUES
    (1, 'admitted', '', 'queued'),
    (2, 'turn_started', 'queued', 'running'),
    (3, CASE WHEN failed THEN 'turn_failed' ELSE 'turn_completed' END, 'running',
        CASE WHEN failed THEN 'failed' ELSE 'succeeded' END)
) AS ev(n, kind, from_state, to_state)
ORDER BY g, ev.n;

UPDATE endpoints_endpoint e SET turn_seq = m.top
FROM (SELECT endpoint_id, max(seq) AS top FROM runtime_turn GROUP BY endpoint_id) m
WHERE m.endpoint_id = e.id;
"""


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=DATABASE_URL,
        CELERY_BROKER_URL="redis://127.0.0.1:6379/11",
        PYTHONPATH=str(ROOT),
    )
    return out


def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env(),
        check=check,
        capture_output=True,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="tickets")
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    opts = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    try:
        manage("migrate", "--no-input", "-v0")
        base = datetime.now(UTC) - timedelta(seconds=opts.n * 0.01 + 3600)
        t0 = time.monotonic()
        with psycopg.connect(DATABASE_URL) as conn:
            params = {
                "n": opts.n,
                "e": opts.endpoints,
                "base": base,
                "base_ms": int(base.timestamp() * 1000),
            }
            for statement in SEED.split(";\n"):
                if statement.strip():
                    conn.execute(statement, params)
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            sizes = conn.execute(
                "SELECT (SELECT count(*) FROM tickets_ticket),"
                " (SELECT count(*) FROM runtime_turn),"
                " (SELECT count(*) FROM tickets_ticketevent),"
                " pg_size_pretty(pg_database_size(current_database()))"
            ).fetchone()
        seeded = time.monotonic() - t0
        print(
            f"seeded {sizes[0]:,} tickets, {sizes[1]:,} turns, {sizes[2]:,} events "
            f"({sizes[3]}) in {seeded:.1f} s"
        )
        # --since over the newest 1% of the tickets.
        since = (base + timedelta(seconds=opts.n * 0.01 * 0.99)).isoformat()
        for label, extra in (("whole ledger", []), ("--since newest 1%", ["--since", since])):
            times, per_check = [], {}
            for _ in range(opts.reps):
                start = time.monotonic()
                done = manage("audit_ledger", "--json", *extra, check=False)
                times.append(time.monotonic() - start)
                report = json.loads(done.stdout)
                if done.returncode != 0 or not report["ok"]:
                    print(done.stdout[-3000:], done.stderr[-3000:])
                    raise SystemExit(f"the seeded ledger is not clean ({label})")
                per_check = report["check_seconds"]
                inside = report["seconds"]
            print(
                f"audit_ledger {label}: {min(times):.2f} s wall (best of {opts.reps}, "
                f"incl. ~Django start-up), {inside:.2f} s in the checks; per check: "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_check.items()))
            )
    finally:
        if not opts.keep:
            with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
