"""Admissions per second through ``tickets.admission.admit_ticket``, against
raw PostgreSQL (and raw Celery publish) floors measured in the same run, on
the same database and broker.

    .venv/bin/python bench/admission.py [-n 2000] [--reps 3] [--block 50] [--profile] [--pin]

Single-threaded, autocommit. Each repetition runs N iterations of each phase:

- ``new``: admit_ticket with a distinct dedupe_key. Admission never talks to
  the broker: its statement marks the ticket ``needs_dispatch`` and calls
  ``pg_notify`` (the dispatcher publishes; none runs here);
- ``new, publish off``: the same with ``app.send_task`` replaced by a no-op in
  this process only (kept from when admission published: now the same work);
- ``duplicate``: admit_ticket again with the keys and inputs of ``new``;
- floor ``raw CTE``: the one-statement admission (bench/floor_sql.py: INSERT ...
  ON CONFLICT DO NOTHING RETURNING, the event and the trace row in one CTE)
  executed with psycopg directly (its defaults: server-side binding, prepared
  from the fifth execution), parameters built before the clock starts;
- floor ``raw duplicate``: the same statement on a key that exists (the
  conflict: no row, nothing to flush to the WAL) and then a SELECT of the
  existing ticket by id: two round trips (the floor issue 12's duplicate
  target is stated against);
- floor ``raw duplicate, one statement``: the statement alone on a key that
  exists; it returns the existing ticket whole, which is all the duplicate
  path now sends (one round trip);
- floor ``raw insert``: a single-row INSERT into a scratch table;
- floor ``raw send_task``: Celery's ``app.send_task`` of the same message to
  the same broker, alone (the publish's own floor);
- floor ``raw CTE + send_task``: both in one loop: what an admission that
  publishes cannot go below;
- diagnostic ``raw CTE, client-side``: the statement through a psycopg
  ``ClientCursor`` with prepared statements off, which is how Django sends it
  (Django's defaults: client-side binding, ``prepare_threshold`` None).

The machine is shared (other engineers' test suites share its 2 cores and
PostgreSQL's WAL disk), so the phases are interleaved in blocks of
``--block`` iterations: every phase sees the same background load, and the
ratios stay meaningful even when the absolute figures swing. The order of
the phases rotates from block to block (``benchlib.block_order``), so none
always pays for coming first. A figure is the
median over repetitions; a ratio is figure / floor (1.0: the code adds
nothing to the work its floor does).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

ADDRESS = "bench.admission"
PHASES = [
    "new",
    "new_nopublish",
    "duplicate",
    "raw_cte",
    "raw_dup",
    "raw_dup_one",
    "raw_insert",
    "raw_send",
    "raw_cte_send",
    "raw_cte_clientside",
]
# Phases that leave one message each on the broker's ``turns`` list.
# Admission itself publishes nothing (the dispatcher does, off the request
# path): only the raw send floors put messages on the broker.
PUBLISHING = ("raw_send", "raw_cte_send")
# The interleaving's groups (benchlib.block_order): a duplicate phase runs
# after the phase whose keys it repeats.
PHASE_GROUPS = [
    ["new", "duplicate"],
    ["new_nopublish"],
    ["raw_cte", "raw_dup", "raw_dup_one"],
    ["raw_insert"],
    ["raw_send"],
    ["raw_cte_send"],
    ["raw_cte_clientside"],
]
assert sorted(p for g in PHASE_GROUPS for p in g) == sorted(PHASES)


def ticket_input(key: str) -> dict:
    return {"key": key, "text": "benchmark admission"}


# --- the measured loops: each returns the seconds it took ------------------------------------


def admit_loop(keys: list[str]) -> float:
    from tickets.admission import admit_ticket

    started = time.perf_counter()
    for key in keys:
        admitted = admit_ticket(endpoint=ADDRESS, input=ticket_input(key), dedupe_key=key)
        assert not admitted.duplicate
    return time.perf_counter() - started


def admit_nopublish_loop(keys: list[str]) -> float:
    from config.celery import app

    # Only the broker I/O goes: publish(), on_commit and the closure still run.
    with mock.patch.object(app, "send_task", lambda *a, **kw: None):
        return admit_loop(keys)


def duplicate_loop(keys: list[str]) -> float:
    from tickets.admission import admit_ticket

    started = time.perf_counter()
    for key in keys:
        admitted = admit_ticket(endpoint=ADDRESS, input=ticket_input(key), dedupe_key=key)
        assert admitted.duplicate
    return time.perf_counter() - started


def cte_params(keys: list[str]) -> list[dict]:
    """Parameters for the floor's statement (bench/floor_sql.py), built
    before the clock starts: the floor is the statement alone."""
    from django.conf import settings
    from django.utils import timezone

    from core.canonical import canonical_json
    from core.ids import new_id

    rows = []
    for key in keys:
        now = timezone.now()
        ticket_id = new_id()
        body = canonical_json(ticket_input(key))
        rows.append(
            {
                "address": ADDRESS,
                "id": ticket_id,
                "dedupe_key": key,
                "sha": hashlib.sha256(body).hexdigest(),
                "input": body.decode(),
                "trace_id": ticket_id.hex,
                "requester": "{}",
                "submitted_by_id": None,
                "due": now + timedelta(seconds=settings.OBLIGATION_UPDATE_INTERVAL_S),
                "now": now,
                "actor": "",
            }
        )
    return rows


def raw_cte_loop(conn, rows: list[dict], *, expect_row: bool = True) -> float:
    from bench.floor_sql import ADMISSION_CTE as _FAST_SQL

    started = time.perf_counter()
    for params in rows:
        row = conn.execute(_FAST_SQL, params).fetchone()
        assert (row is not None) == expect_row
    return time.perf_counter() - started


def raw_dup_loop(conn, rows: list[dict], endpoint_id: int) -> float:
    from bench.floor_sql import ADMISSION_CTE as _FAST_SQL

    started = time.perf_counter()
    for params in rows:
        # The statement finds the ticket that holds the key (its id and input
        # hash); the full row is then read by id.
        found = conn.execute(_FAST_SQL, params).fetchone()
        assert found is not None and _found_sha(found) == params["sha"]
        existing = conn.execute(
            "SELECT * FROM tickets_ticket WHERE id = %s", (found[0],)
        ).fetchone()
        assert existing is not None
    return time.perf_counter() - started


def raw_dup_one_loop(conn, rows: list[dict]) -> float:
    """The statement alone on a key that exists: it returns the existing
    ticket whole (one round trip, what the duplicate path now does)."""
    from bench.floor_sql import ADMISSION_CTE as _FAST_SQL

    started = time.perf_counter()
    for params in rows:
        found = conn.execute(_FAST_SQL, params).fetchone()
        assert found is not None and _found_sha(found) == params["sha"]
    return time.perf_counter() - started


def _found_sha(row: tuple) -> str:
    """The input hash of the ticket the duplicate branch of ``_FAST_SQL``
    returns (its row as one JSON value, after eight columns)."""
    return row[8]["input_sha256"]


def raw_insert_loop(conn, rows: list[tuple]) -> float:
    started = time.perf_counter()
    for row in rows:
        conn.execute("INSERT INTO bench_scratch (id, k, v) VALUES (%s, %s, %s::jsonb)", row)
    return time.perf_counter() - started


def raw_send_loop(ids: list[str]) -> float:
    from config.celery import app
    from core.dispatch import RUN_TICKET

    started = time.perf_counter()
    for ticket_id in ids:
        app.send_task(RUN_TICKET, args=[ticket_id], countdown=None)
    return time.perf_counter() - started


def raw_cte_send_loop(conn, rows: list[dict]) -> float:
    from bench.floor_sql import ADMISSION_CTE as _FAST_SQL
    from config.celery import app
    from core.dispatch import RUN_TICKET

    started = time.perf_counter()
    for params in rows:
        row = conn.execute(_FAST_SQL, params).fetchone()
        app.send_task(RUN_TICKET, args=[str(row[0])], countdown=None)
    return time.perf_counter() - started


# --- one repetition ----------------------------------------------------------------------------


def repetition(tag: str, n: int, block: int, raw, raw_client, endpoint_id: int) -> dict[str, float]:
    """N iterations of every phase, interleaved block by block; returns the
    rate per phase. Inputs are built before any clock starts."""
    keys = {p: [f"{tag}-{p}-{i}" for i in range(n)] for p in PHASES}
    cte_rows = {p: cte_params(keys[p]) for p in ("raw_cte", "raw_cte_send", "raw_cte_clientside")}
    # The raw_cte keys again with fresh ticket ids: every row hits the conflict.
    dup_rows = cte_params(keys["raw_cte"])
    insert_rows = [(uuid.uuid4(), k, json.dumps(ticket_input(k))) for k in keys["raw_insert"]]
    send_ids = [str(uuid.uuid4()) for _ in range(n)]

    loops: dict[str, Callable[[slice], float]] = {
        "new": lambda s: admit_loop(keys["new"][s]),
        "new_nopublish": lambda s: admit_nopublish_loop(keys["new_nopublish"][s]),
        "duplicate": lambda s: duplicate_loop(keys["new"][s]),  # after "new" in each block
        "raw_cte": lambda s: raw_cte_loop(raw, cte_rows["raw_cte"][s]),
        "raw_dup": lambda s: raw_dup_loop(raw, dup_rows[s], endpoint_id),
        "raw_dup_one": lambda s: raw_dup_one_loop(raw, dup_rows[s]),
        "raw_insert": lambda s: raw_insert_loop(raw, insert_rows[s]),
        "raw_send": lambda s: raw_send_loop(send_ids[s]),
        "raw_cte_send": lambda s: raw_cte_send_loop(raw, cte_rows["raw_cte_send"][s]),
        "raw_cte_clientside": lambda s: raw_cte_loop(raw_client, cte_rows["raw_cte_clientside"][s]),
    }
    seconds = dict.fromkeys(PHASES, 0.0)
    for number, start in enumerate(range(0, n, block)):
        part = slice(start, min(start + block, n))
        for phase in benchlib.block_order(PHASE_GROUPS, number):
            seconds[phase] += loops[phase](part)
    published = benchlib.broker_depth("turns")
    expected = n * len(PUBLISHING)
    assert published == expected, f"expected {expected} messages on the broker, saw {published}"
    benchlib.flush_broker()
    return {p: benchlib.rate(n, s) for p, s in seconds.items()}


def count_queries() -> dict[str, int]:
    """Round trips of one new and one duplicate admission (publish off),
    counted through Django's cursor."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from config.celery import app
    from tickets.admission import admit_ticket

    key = f"count-{uuid.uuid4().hex}"
    with mock.patch.object(app, "send_task", lambda *a, **kw: None):
        with CaptureQueriesContext(connection) as new:
            admit_ticket(endpoint=ADDRESS, input=ticket_input(key), dedupe_key=key)
        with CaptureQueriesContext(connection) as dup:
            admit_ticket(endpoint=ADDRESS, input=ticket_input(key), dedupe_key=key)
    return {"new": len(new.captured_queries), "duplicate": len(dup.captured_queries)}


def profile(n: int) -> None:
    """cProfile of the new path (publishing) and of the duplicate path."""
    keys = [f"prof-{uuid.uuid4().hex}" for _ in range(n)]
    for name, fn in (("new", admit_loop), ("duplicate", duplicate_loop)):
        prof = cProfile.Profile()
        prof.runcall(fn, keys)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
        print(f"--- cProfile: {name} path, {n} admissions ---")
        print(out.getvalue())
    benchlib.flush_broker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="iterations per phase (<= 20000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (<= 7)")
    parser.add_argument("--block", type=int, default=50, help="iterations per interleaved block")
    parser.add_argument("--warmup", type=int, default=200, help="iterations per phase, untimed")
    parser.add_argument("--profile", action="store_true", help="also print cProfile of each path")
    parser.add_argument("--keep", action="store_true", help="keep claimcheck_bench afterwards")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="this process on one core, its PostgreSQL backends on the other (finding 14)",
    )
    args = parser.parse_args()
    n, reps, block = min(args.n, 20_000), min(args.reps, 7), max(1, args.block)
    benchlib.start_wall_clock()

    benchlib.recreate_database()
    benchlib.flush_broker()
    benchlib.setup_django()

    import psycopg
    from django.db import connection

    from endpoints.services import create_endpoint

    endpoint = create_endpoint(
        address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"}
    )
    benchlib.seed_ledger(endpoint.id)
    # psycopg's defaults: server-side binding, prepared from the 5th execution.
    raw = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    # How Django talks to PostgreSQL: client-side binding, nothing prepared.
    raw_client = psycopg.connect(
        benchlib.DATABASE_URL,
        autocommit=True,
        cursor_factory=psycopg.ClientCursor,
        prepare_threshold=None,
    )
    raw.execute("CREATE TABLE bench_scratch (id uuid PRIMARY KEY, k text, v jsonb)")
    if args.pin:
        with connection.cursor() as cursor:  # the connection admit_ticket uses
            cursor.execute("SELECT pg_backend_pid()")
            pids = [cursor.fetchone()[0]]
        pids += [c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (raw, raw_client)]
        print(benchlib.pin_to_cores(pids), flush=True)
    rates: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        # Warm up every path: imports, connections, psycopg's prepared statements.
        repetition("warm", args.warmup, block, raw, raw_client, endpoint.id)
        for rep in range(reps):
            got = repetition(f"r{rep}", n, block, raw, raw_client, endpoint.id)
            for phase, value in got.items():
                rates[phase].append(value)
            print(
                f"  rep {rep + 1}/{reps}: " + "  ".join(f"{p} {got[p]:.0f}/s" for p in PHASES),
                flush=True,
            )
        queries = count_queries()
        if args.profile:
            profile(min(n, 2000))
    finally:
        raw.close()
        raw_client.close()
        benchlib.flush_broker()
        connection.close()
        if not args.keep:
            benchlib.drop_database()

    med = {p: benchlib.median(v) for p, v in rates.items()}

    def ratio(a: str, b: str) -> float:
        return round(med[a] / med[b], 3)

    publish_ms = 1e3 / med["new"] - 1e3 / med["new_nopublish"]
    print(
        f"admission new: {med['new']:.0f}/s  raw CTE floor: {med['raw_cte']:.0f}/s  "
        f"ratio {ratio('new', 'raw_cte'):.2f}"
    )
    print(
        f"  vs raw CTE + raw send_task floor {med['raw_cte_send']:.0f}/s: "
        f"ratio {ratio('new', 'raw_cte_send'):.2f};  "
        f"vs raw single-row insert floor {med['raw_insert']:.0f}/s: "
        f"ratio {ratio('new', 'raw_insert'):.2f}"
    )
    print(
        f"admission new, publish off: {med['new_nopublish']:.0f}/s  "
        f"raw CTE floor: {med['raw_cte']:.0f}/s  ratio {ratio('new_nopublish', 'raw_cte'):.2f}"
    )
    print(
        f"admission duplicate: {med['duplicate']:.0f}/s  "
        f"raw duplicate floor (CTE on the existing key + SELECT): {med['raw_dup']:.0f}/s  "
        f"ratio {ratio('duplicate', 'raw_dup'):.2f}"
    )
    print(
        f"  vs the statement alone on the existing key (it returns the row: one round trip) "
        f"{med['raw_dup_one']:.0f}/s: ratio {ratio('duplicate', 'raw_dup_one'):.2f}"
    )
    print(
        f"split: new minus publish-off {publish_ms:.2f} ms (admission no longer publishes); "
        f"raw Celery send_task "
        f"alone {1e3 / med['raw_send']:.2f} ms ({med['raw_send']:.0f}/s)"
    )
    print(
        f"diagnostic: the CTE sent as Django sends it (client-side binding, not prepared) "
        f"{med['raw_cte_clientside']:.0f}/s, ratio {ratio('raw_cte_clientside', 'raw_cte'):.2f} "
        f"to the raw CTE floor"
    )
    print(
        f"round trips per admission: new {queries['new']}, duplicate {queries['duplicate']} "
        f"(floors: 1, and 2 or 1)"
    )
    summary = {
        "bench": "admission",
        "n": n,
        "reps": reps,
        "block": block,
        "per_s": {p: round(v, 1) for p, v in med.items()},
        "per_s_runs": {p: [round(x, 1) for x in v] for p, v in rates.items()},
        "ratio": {
            "new_vs_raw_cte": ratio("new", "raw_cte"),
            "new_vs_raw_cte_send": ratio("new", "raw_cte_send"),
            "new_vs_raw_insert": ratio("new", "raw_insert"),
            "new_nopublish_vs_raw_cte": ratio("new_nopublish", "raw_cte"),
            "duplicate_vs_raw_dup": ratio("duplicate", "raw_dup"),
            "duplicate_vs_raw_dup_one": ratio("duplicate", "raw_dup_one"),
            "raw_cte_clientside_vs_raw_cte": ratio("raw_cte_clientside", "raw_cte"),
        },
        "publish_ms": round(publish_ms, 3),
        "queries": queries,
    }
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
