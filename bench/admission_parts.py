"""What the admission statement costs, part by part: the fast path's own
statement (bench/floor_sql.py, once ``tickets.admission._FAST_SQL``) taken apart, each variant run
against the one-row insert floor in the same run, on the same database.

    .venv/bin/python bench/admission_parts.py [-n 2000] [--reps 3] [--block 50]

Issue 12 asks for the raw statement within 2x of the one-statement floor,
and for what makes it dearer. Every variant is derived from ``_FAST_SQL``
itself (a CTE removed, the NOTIFY replaced by a constant), so the parts are
the shipped statement's parts, each adding one thing to the one before:

- ``insert``: a single-row INSERT into a scratch table (the floor);
- ``bare_row``: the ticket's row, every column as admission writes it, into
  a copy of ``tickets_ticket`` with its primary key alone (a wide row);
- ``indexed_row``: the same INSERT into ``tickets_ticket`` (its unique
  dedupe key, its secondary and partial indexes, the endpoint's foreign
  key);
- ``resolve``: the statement's ticket CTE alone: the endpoint resolved by
  address or alias, its state, its busy policy, ``ON CONFLICT DO NOTHING``
  and the duplicate branch (which finds nothing for a new key);
- ``event``: plus the admitted event;
- ``trace``: plus the trace row;
- ``full``: plus the NOTIFY: ``_FAST_SQL`` exactly as shipped.

Single-threaded, autocommit, psycopg's defaults (server-side binding,
prepared from the fifth execution), parameters built before the clock
starts. The phases are interleaved in blocks of ``--block`` with their
order rotating (``benchlib.block_order``), so every phase sees the same
background load. Prints each rate, its ratio to the floor and what the part
adds in microseconds; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402
from bench.admission import ADDRESS, cte_params  # noqa: E402

PHASES = ["insert", "bare_row", "indexed_row", "resolve", "event", "trace", "full"]
GROUPS = [[p] for p in PHASES]

_NOTIFY = "pg_notify('claimcheck_dispatch', '') IS NULL AS woke"


def _without_cte(sql: str, name: str) -> str:
    """``sql`` without its CTE ``name`` (a ``name AS (...)`` block with no
    nested parentheses on its own lines)."""
    out, n = re.subn(rf",\n{name} AS \(\n.*?\n\)(?=\n)", "", sql, count=1, flags=re.S)
    assert n == 1, f"no CTE {name} in the statement"
    return out


def variants() -> dict[str, str]:
    """The statement's variants, each derived from the shipped text."""
    from bench.floor_sql import ADMISSION_CTE as _FAST_SQL

    assert _NOTIFY in _FAST_SQL
    no_notify = _FAST_SQL.replace(_NOTIFY, "false AS woke")
    no_trace = _without_cte(no_notify, "tr")
    return {
        "full": _FAST_SQL,
        "trace": no_notify,
        "event": no_trace,
        "resolve": _without_cte(no_trace, "ev"),
    }


# The ticket's row as the statement's INSERT writes it, with the endpoint's
# id given: no resolution, no conflict clause, no CTE.
_ROW_SQL = """
INSERT INTO {table} (
    id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state,
    artifacts, requester, submitted_by_id, callback_state, delivery_state,
    needs_dispatch, obligation_state, obligation_due_at, obligation_overdue,
    obligation_note, created_at, updated_at)
VALUES (%(id)s, %(endpoint)s, %(dedupe_key)s, %(sha)s, %(input)s::jsonb, %(trace_id)s, 0,
    'queued', '[]'::jsonb, %(requester)s::jsonb, %(submitted_by_id)s, 'none', 'none', true,
    'open', %(due)s, false, '', %(now)s, %(now)s)
"""


def timed(conn, sql: str, rows: list[dict]) -> float:
    started = time.perf_counter()
    for params in rows:
        conn.execute(sql, params)
    return time.perf_counter() - started


def repetition(tag: str, n: int, block: int, conn, endpoint_id: int) -> dict[str, float]:
    rows = {p: cte_params([f"{tag}-{p}-{i}" for i in range(n)]) for p in PHASES}
    for p in ("bare_row", "indexed_row"):
        for r in rows[p]:
            r["endpoint"] = endpoint_id
    sql = variants()
    scratch = "INSERT INTO bench_scratch (id, k, v) VALUES (%(id)s, %(dedupe_key)s, %(input)s)"
    loops: dict[str, Callable[[slice], float]] = {
        "insert": lambda s: timed(conn, scratch, rows["insert"][s]),
        "bare_row": lambda s: timed(
            conn, _ROW_SQL.format(table="bench_ticket_bare"), rows["bare_row"][s]
        ),
        "indexed_row": lambda s: timed(
            conn, _ROW_SQL.format(table="tickets_ticket"), rows["indexed_row"][s]
        ),
        **{p: (lambda s, p=p: timed(conn, sql[p], rows[p][s])) for p in sql},
    }
    seconds = dict.fromkeys(PHASES, 0.0)
    for number, start in enumerate(range(0, n, block)):
        part = slice(start, min(start + block, n))
        for phase in benchlib.block_order(GROUPS, number):
            seconds[phase] += loops[phase](part)
    return {p: benchlib.rate(n, s) for p, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="iterations per phase (<= 20000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (<= 7)")
    parser.add_argument("--block", type=int, default=50, help="iterations per interleaved block")
    parser.add_argument("--warmup", type=int, default=200, help="iterations per phase, untimed")
    args = parser.parse_args()
    n, reps, block = min(args.n, 20_000), min(args.reps, 7), max(1, args.block)
    benchlib.start_wall_clock()
    benchlib.recreate_database()
    benchlib.setup_django()

    import psycopg
    from django.db import connection

    from endpoints.services import create_endpoint

    endpoint = create_endpoint(
        address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"}
    )
    benchlib.seed_ledger(endpoint.id)
    conn = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    conn.execute("CREATE TABLE bench_scratch (id uuid PRIMARY KEY, k text, v jsonb)")
    conn.execute(
        "CREATE TABLE bench_ticket_bare (LIKE tickets_ticket INCLUDING DEFAULTS); "
        "ALTER TABLE bench_ticket_bare ADD PRIMARY KEY (id)"
    )
    rates: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        repetition("warm", args.warmup, block, conn, endpoint.id)
        for rep in range(reps):
            got = repetition(f"r{rep}", n, block, conn, endpoint.id)
            for phase, value in got.items():
                rates[phase].append(value)
            print(
                f"  rep {rep + 1}/{reps}: " + "  ".join(f"{p} {got[p]:.0f}/s" for p in PHASES),
                flush=True,
            )
    finally:
        conn.close()
        connection.close()
        benchlib.drop_database()

    med = {p: benchlib.median(v) for p, v in rates.items()}
    floor = med["insert"]
    print(f"{'phase':<12} {'rate':>8} {'/ insert':>9} {'us each':>8} {'adds us':>8}")
    before = None
    for p in PHASES:
        us = 1e6 / med[p]
        adds = "" if before is None else f"{us - before:+8.0f}"
        print(f"{p:<12} {med[p]:>7.0f}/s {med[p] / floor:>9.2f} {us:>8.0f} {adds:>8}")
        before = us
    print(f"the shipped statement is {floor / med['full']:.2f}x the one-row insert (target <= 2)")
    print(
        json.dumps(
            {
                "bench": "admission_parts",
                "n": n,
                "reps": reps,
                "per_s": {p: round(v, 1) for p, v in med.items()},
                "per_s_runs": {p: [round(x, 1) for x in v] for p, v in rates.items()},
                "vs_insert": {p: round(med[p] / floor, 3) for p in PHASES},
            },
            separators=(",", ":"),
        )
    )


if __name__ == "__main__":
    main()
