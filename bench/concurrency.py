"""Admissions at the database, from 1 to 64 clients: where a deployment with
many web hosts spends its one primary.

pgbench (C clients, so the database is what is measured, not a Python
client) runs each statement for ``-T`` seconds at each client count, in
one run, against one database server:

- ``insert``: a one-row insert (the floor: what any write costs);
- ``insert_notify``: the same insert that also calls ``pg_notify`` in its
  transaction (what a notifying commit costs: PostgreSQL serialises those
  across the WAL flush, ``PreCommit_Notify``);
- ``admit``: ``claimcheck_admit`` of a new key, as the application calls it
  (no NOTIFY: the wake follows the commit, core/wakes.py);
- ``admit_notify``: the same function with the dispatcher's ``pg_notify``
  back inside its transaction (the shape before the wake moved out), made
  from the installed one in this database, so the two differ by that alone;
- ``procrastinate``: Procrastinate's ``procrastinate_defer_jobs_v1`` with a
  queueing lock (its schema in a database of its own), a peer's job.

Every figure is transactions per second; the summary gives each as a ratio
to ``insert`` and to ``procrastinate`` at the same client count, and whether
admissions scale (32 clients against 8). ``make bench-concurrency``; the
last line of the output is the JSON summary ``bench/bench_all.py`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

DB = "claimcheck_bench_concurrency"
PC_DB = "claimcheck_bench_concurrency_pc"
ADDRESS = "bench.concurrency"
CLIENTS = (1, 8, 32, 64)

# A time-ordered id, as the application's (UUIDv7-like: milliseconds first),
# so the ticket's primary key grows at its right edge as in production.
_ID = (
    "(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')"
    " || substr(md5(random()::text), 1, 20))::uuid"
)
_KEY = "md5(random()::text || :client_id || ':' || :r)"

SCRIPTS = {
    "insert": "INSERT INTO bench_one_row (id, k) VALUES ({id}, {key});",
    "insert_notify": (
        "INSERT INTO bench_one_row (id, k) VALUES ({id}, {key})"
        " RETURNING pg_notify('bench_concurrency', '');"
    ),
    "admit": (
        "SELECT o_status FROM claimcheck_admit_v2(p_id => {id}, p_address => '" + ADDRESS + "',"
        " p_dedupe_key => {key}, p_sha => md5(:r::text), p_input => '{{\"x\": 1}}'::jsonb,"
        " p_parent => NULL, p_trace => NULL, p_return_to => NULL, p_continuation => NULL,"
        " p_requester => '{{}}'::jsonb, p_callback_for => NULL, p_rerun_of => NULL,"
        " p_submitted_by => NULL, p_may_submit_restricted => false, p_actor => 'bench',"
        " p_now => now(), p_due => now() + interval '1 hour', p_soft => 50, p_hard => 200);"
    ),
    "procrastinate": (
        "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW('bench', 'noop', 0, NULL, {key},"
        " '{{\"x\": 1}}'::jsonb, NULL::timestamptz)]::procrastinate_job_to_defer_v1[]);"
    ),
}
SCRIPTS["admit_notify"] = SCRIPTS["admit"].replace("claimcheck_admit_v2(", "bench_admit_notify(")


def _script(name: str) -> str:
    return "\\set r random(1, 2000000000)\n" + SCRIPTS[name].format(id=_ID, key=_KEY) + "\n"


def _admit_notify_source(db) -> str:
    """The installed claimcheck_admit with the dispatcher's NOTIFY put back
    into its insert (its shape before the wake followed the commit)."""
    source = db.execute("SELECT pg_get_functiondef('claimcheck_admit_v2'::regproc)").fetchone()[0]
    changed, n = re.subn(
        r"ON CONFLICT \(endpoint_id, dedupe_key\) DO NOTHING;",
        "ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING;\n"
        "IF FOUND THEN PERFORM pg_notify('claimcheck_dispatch', ''); END IF;",
        source,
    )
    if n != 1:
        raise SystemExit("claimcheck_admit_v2's insert changed: update bench/concurrency.py")
    return changed.replace("public.claimcheck_admit_v2(", "public.bench_admit_notify(", 1)


def setup(seed: int) -> None:
    import psycopg

    benchlib.use_database(DB)
    benchlib.recreate_database()
    benchlib.setup_django()
    from endpoints.services import create_endpoint

    ep = create_endpoint(address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"})
    if seed:
        benchlib.seed_ledger(ep.id, tickets=seed)
    with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
        db.execute("CREATE TABLE bench_one_row (id uuid PRIMARY KEY, k text NOT NULL)")
        db.execute(_admit_notify_source(db))
        db.execute("VACUUM ANALYZE")
    # Procrastinate in a database of its own, its schema from its package.
    import procrastinate

    benchlib.create_empty_database(PC_DB + benchlib.SUFFIX)
    schema = (Path(procrastinate.__file__).parent / "sql" / "schema.sql").read_text()
    with psycopg.connect(f"{benchlib.PG_SERVER}/{PC_DB}{benchlib.SUFFIX}", autocommit=True) as db:
        db.execute(schema)


def pgbench(name: str, clients: int, seconds: int) -> float:
    db = PC_DB + benchlib.SUFFIX if name == "procrastinate" else benchlib.DB_NAME
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(_script(name))
        path = f.name
    try:
        out = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", "-f", path, "-c", str(clients),
             "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(seconds),
             "-h", "127.0.0.1", "-U", "postgres", db],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        os.unlink(path)
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise SystemExit(f"pgbench printed no tps for {name}:\n{out}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-T", type=int, default=8, help="seconds a point")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    parser.add_argument("--seed", type=int, default=20_000, help="finished tickets first")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    benchlib.start_wall_clock(limit_s=max(900, 60 + args.reps * len(clients) * 5 * (args.T + 2)))
    setup(args.seed)
    load0 = os.getloadavg()[0]
    runs: dict[str, dict[int, list[float]]] = {name: {c: [] for c in clients} for name in SCRIPTS}
    try:
        for rep in range(args.reps):
            for c in clients:
                # Interleaved: every system meets the same minute of the machine.
                for name in SCRIPTS:
                    tps = pgbench(name, c, args.T)
                    runs[name][c].append(tps)
                    print(f"  rep {rep + 1} c{c:<3} {name:<14} {tps:10.0f} tx/s", flush=True)
    finally:
        if not args.keep:
            benchlib.drop_database_named(benchlib.DB_NAME)
            benchlib.drop_database_named(PC_DB + benchlib.SUFFIX)
    med = {n: {c: benchlib.median(v) for c, v in by.items()} for n, by in runs.items()}
    print(f"\nmedian tx/s of {args.reps} ({args.T} s a point); load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"  {'clients':<14}" + "".join(f"{c:>10}" for c in clients))
    for name in SCRIPTS:
        print(f"  {name:<14}" + "".join(f"{med[name][c]:10.0f}" for c in clients))
    ratios = {
        c: {
            "admit_vs_insert": round(med["admit"][c] / med["insert"][c], 3),
            "admit_vs_procrastinate": round(med["admit"][c] / med["procrastinate"][c], 3),
            "admit_vs_admit_notify": round(med["admit"][c] / med["admit_notify"][c], 3),
        }
        for c in clients
    }
    for c in clients:
        print(f"  c{c}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios[c].items()))
    summary = {"bench": "concurrency", "seconds": args.T, "reps": args.reps,
               "per_s": {n: {str(c): round(v) for c, v in by.items()} for n, by in med.items()},
               "runs": {n: {str(c): v for c, v in by.items()} for n, by in runs.items()},
               "ratio": {str(c): r for c, r in ratios.items()},
               "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}  # fmt: skip
    if 8 in med["admit"] and 32 in med["admit"]:
        summary["admit_32_vs_8"] = round(med["admit"][32] / med["admit"][8], 3)
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
