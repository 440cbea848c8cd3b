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
  queueing lock (its schema in a database of its own), a peer's job;
- ``dbos``: DBOS's enqueue as its client sends it (one transaction: the
  ``workflow_status`` insert and the ``workflow_input`` insert, captured
  from ``queue.enqueue`` at the start of the run against DBOS's own schema
  in a database of its own, the workflow id made a pgbench variable).

Every figure is transactions per second; the summary gives each as a ratio
to ``insert`` and to ``procrastinate`` at the same client count, and whether
admissions scale (32 clients against 8).

Then through the stack, each against its floor or peer in the same run
(``--parts`` picks; all by default):

- ``processes``: ``admit_ticket`` (the Python service, new keys) from 1, 8
  and 32 forked processes for ``--proc-s`` seconds each, beside
  Procrastinate's ``defer`` (its synchronous connector, one connection a
  process) and a one-row insert through psycopg from as many processes;
- ``http``: ``POST /api/v1/tickets`` and the django-ninja one-row floor
  (bench/http.py's server, routes and wrk script) at 8, 32 and 64
  connections;
- ``e2e``: no-op work end to end with 1, 2 and 4 worker processes
  (``-c``: Celery's prefork pool; Procrastinate's ``--concurrency``, as
  bench/peers.py): the turn pipeline (bench/turns.py's round), raw Celery
  no-op tasks and Procrastinate jobs, the workers restarted for each count.

``--quick`` is the reduced size ``make bench-all`` runs (end to end with 2
worker processes only, unless ``--workers`` says otherwise). The load average
is recorded with every part. ``make bench-concurrency``; the last line of
the output is the JSON summary ``bench/bench_all.py`` reads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from unittest import mock

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

DB = "claimcheck_bench_concurrency"
PC_DB = "claimcheck_bench_concurrency_pc"
DBOS_DB = "claimcheck_bench_concurrency_dbos"
ADDRESS = "bench.concurrency"
CLIENTS = (1, 8, 32, 64)
# Through the stack, after the database (which always runs).
PARTS = ("processes", "http", "e2e")
PROCESSES = (1, 8, 32)
CONNECTIONS = (8, 32, 64)
WORKERS = (1, 2, 4)
# Endpoints of the end-to-end pipeline (bench/turns.py's K).
E2E_ENDPOINTS = 20

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
    SCRIPTS["dbos"] = _dbos_script()


def pgbench(name: str, clients: int, seconds: int) -> float:
    db = {"procrastinate": PC_DB, "dbos": DBOS_DB}.get(name)
    db = db + benchlib.SUFFIX if db else benchlib.DB_NAME
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(_script(name))
        path = f.name
    try:
        for attempt in range(4):
            out = subprocess.run(
                ["pgbench", "-n", "-M", "prepared", "-f", path, "-c", str(clients),
                 "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(seconds),
                 "-h", "127.0.0.1", "-U", "postgres", db],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            # The server's max_connections is shared with every other session:
            # 64 clients may not fit while someone else's run holds many.
            if out.returncode == 0 or "too many clients" not in out.stderr or attempt == 3:
                break
            time.sleep(10)
        if out.returncode != 0:
            raise SystemExit(f"pgbench {name} -c {clients} failed: {out.stderr[-500:]}")
        out = out.stdout
    finally:
        os.unlink(path)
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise SystemExit(f"pgbench printed no tps for {name}:\n{out}")
    return float(match.group(1))


def _dbos_script() -> str:
    """DBOS's enqueue as its client sends it: ``queue.enqueue`` run once in
    this process against DBOS's schema (in a database of its own), its
    statements captured at psycopg's cursor and rendered with their
    parameters, the workflow id turned into a pgbench expression. One
    transaction, as DBOS runs it."""
    import psycopg
    from dbos import DBOS, SetWorkflowID

    from bench import peer_apps

    name = DBOS_DB + benchlib.SUFFIX
    benchlib.create_empty_database(name)
    peer_apps.DBOS_URL = f"{peer_apps.PG}/{name}"
    peer_apps.launch_dbos(executor_id="bench-concurrency", listen=[])
    queue, _ = peer_apps.register_queues(concurrency=1, poll_s=1.0)
    marker = f"bench-dbos-{uuid.uuid4().hex}"
    sent: list[tuple] = []
    me, plain = threading.get_ident(), psycopg.Cursor.execute

    def execute(cur, query, params=None, **kw):
        if threading.get_ident() == me:  # not DBOS's own threads
            sent.append((query, params))
        return plain(cur, query, params, **kw)

    try:
        with SetWorkflowID(f"bench-dbos-warm-{uuid.uuid4().hex}"):
            queue.enqueue(peer_apps.dbos_noop, {"x": 1})
        with mock.patch.object(psycopg.Cursor, "execute", execute), SetWorkflowID(marker):
            queue.enqueue(peer_apps.dbos_noop, {"x": 1})
    finally:
        DBOS.destroy()
    with psycopg.connect(peer_apps.DBOS_URL) as conn:
        rendered = [psycopg.ClientCursor(conn).mogrify(q, p) for q, p in sent]
    statements = [r for r in rendered if marker in r]
    if len(statements) != 2 or not all(r.startswith("INSERT INTO dbos.") for r in statements):
        raise SystemExit(f"DBOS's enqueue changed: update bench/concurrency.py:\n{rendered}")
    wf_id = "('dbos-' || :client_id || '-' || :r || '-' || :s)"
    body = "\n".join(
        r.replace("{", "{{").replace("}", "}}").replace(f"'{marker}'", wf_id) + ";"
        for r in statements
    )
    return "\\set s random(1, 2000000000)\nBEGIN;\n" + body + "\nCOMMIT;"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# --- through the stack: admit_ticket from N processes ------------------------------------------


def _proc_work(system: str, index: int, seconds: float, ready, go, out) -> None:
    """One forked process: warm, say ready, wait for the start, then admit
    (or defer, or insert) new keys for ``seconds``; put the count."""
    try:
        tag = f"p{index}-{uuid.uuid4().hex[:8]}"
        if system == "claimcheck":
            from tickets.admission import admit_ticket

            def one(i: int) -> None:
                admit_ticket(endpoint=ADDRESS, input={"x": i}, dedupe_key=f"{tag}-{i}")

        elif system == "procrastinate":
            import logging

            import procrastinate

            # Django's logging config sends INFO to stderr: Procrastinate would
            # log every defer, a cost admission does not pay (as peers.py).
            logging.getLogger("procrastinate").setLevel(logging.WARNING)

            app = procrastinate.App(
                connector=procrastinate.SyncPsycopgConnector(
                    conninfo=f"{benchlib.PG_SERVER}/{PC_DB}{benchlib.SUFFIX}",
                    min_size=1,
                    max_size=1,
                )
            )

            @app.task(name="bench.noop", queue="bench")
            def noop(x: int) -> None:
                return None

            app.open()

            def one(i: int) -> None:
                noop.configure(queueing_lock=f"{tag}-{i}").defer(x=i)

        else:
            import psycopg

            conn = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)

            def one(i: int) -> None:
                conn.execute(
                    "INSERT INTO bench_one_row (id, k) VALUES (%s, %s)",
                    (uuid.uuid4(), f"{tag}-{i}"),
                    prepare=True,
                )

        for i in range(5):
            one(-1 - i)
        ready.put(index)
        if not go.wait(timeout=120):
            raise TimeoutError("no start signal")
        count, started = 0, time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            one(count)
            count += 1
        out.put((index, count, time.perf_counter() - started, ""))
    except BaseException as exc:  # the parent reports it
        ready.put(index)
        out.put((index, 0, 0.0, f"{type(exc).__name__}: {exc}"))


def wal_stats() -> dict[str, float]:
    """The cluster's WAL writes and flushes (``pg_stat_wal``): shared with
    every other session of the server, so read them as an upper bound."""
    import psycopg

    with psycopg.connect(f"{benchlib.PG_SERVER}/postgres", autocommit=True) as conn:
        row = conn.execute("SELECT wal_write, wal_sync, wal_bytes FROM pg_stat_wal").fetchone()
    return {"writes": row[0], "syncs": row[1], "bytes": float(row[2])}


def processes_point(system: str, n: int, seconds: float) -> dict:
    """``system`` from ``n`` forked processes for ``seconds``: operations a
    second, all processes together, and the cluster's WAL flushes per
    operation over the window (group commit: fewer with more processes)."""
    from django.db import connections

    connections.close_all()  # a forked child must not share the parent's session
    ctx = multiprocessing.get_context("fork")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_proc_work, args=(system, i, seconds, ready, go, out), daemon=True)
        for i in range(n)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in range(n):
            ready.get(timeout=180)
        wal0 = wal_stats()
        go.set()
        got = [out.get(timeout=seconds + 120) for _ in range(n)]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    errors = [e for *_, e in got if e]
    if errors:
        raise SystemExit(f"{system} x{n}: {errors[0]}")
    time.sleep(0.5)  # the exited backends' statistics reach pg_stat_wal
    wal1 = wal_stats()
    ops = max(1, sum(count for _, count, _, _ in got))
    # Each process's own rate, summed: they ran over the same window.
    return {
        "per_s": sum(count / elapsed for _, count, elapsed, _ in got),
        "wal_syncs_per_op": round((wal1["syncs"] - wal0["syncs"]) / ops, 3),
        "wal_bytes_per_op": round((wal1["bytes"] - wal0["bytes"]) / ops),
    }


SYSTEMS_PROCESSES = ("claimcheck", "procrastinate", "insert")


def run_processes(counts: list[int], seconds: float, reps: int) -> dict:
    runs = {s: {n: [] for n in counts} for s in SYSTEMS_PROCESSES}
    syncs = {s: {n: [] for n in counts} for s in SYSTEMS_PROCESSES}
    load0 = _load()
    for rep in range(reps):
        for n in counts:
            for system in SYSTEMS_PROCESSES:
                got = processes_point(system, n, seconds)
                runs[system][n].append(got["per_s"])
                syncs[system][n].append(got["wal_syncs_per_op"])
                print(f"  rep {rep + 1} x{n:<3} {system:<14} {got['per_s']:10.0f} /s  "
                      f"WAL flushes/op {got['wal_syncs_per_op']:.2f}  "
                      f"WAL bytes/op {got['wal_bytes_per_op']}  (load {_load()})",
                      flush=True)  # fmt: skip
    med = {s: {n: benchlib.median(v) for n, v in by.items()} for s, by in runs.items()}
    ratio = {
        str(n): {
            "claimcheck_vs_procrastinate": round(med["claimcheck"][n] / med["procrastinate"][n], 3),
            "claimcheck_vs_insert": round(med["claimcheck"][n] / med["insert"][n], 3),
        }
        for n in counts
    }
    return {"seconds": seconds, "reps": reps,
            "per_s": {s: {str(n): round(v) for n, v in by.items()} for s, by in med.items()},
            "runs": {s: {str(n): [round(x) for x in v] for n, v in by.items()}
                     for s, by in runs.items()},
            "ratio": ratio, "load": [load0, _load()],
            "wal_syncs_per_op": {s: {str(n): benchlib.median(v) for n, v in by.items()}
                                 for s, by in syncs.items()}}  # fmt: skip


# --- through the stack: HTTP --------------------------------------------------------------------


def run_http(conn_counts: list[int], seconds: float, reps: int, log_dir: Path) -> dict:
    """bench/http.py's server and wrk script against this run's database:
    the ticket route and the one-row floor, interleaved."""
    import psycopg
    from django.db import connection

    from accounts.keys import create_api_key
    from bench import http as bhttp
    from endpoints.services import create_endpoint

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    create_endpoint(address=bhttp.ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"})
    _, api_key = create_api_key(username="bench-concurrency-http")
    connection.close()
    workers = 2 * (os.cpu_count() or 1) + 1
    routes = ("tickets", "floor")
    port = bhttp.free_port()
    url = f"http://127.0.0.1:{port}"
    results: dict[tuple[str, int], list[dict]] = {}
    load0 = _load()
    with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
        db.execute(bhttp.FLOOR_DDL)
        server = bhttp.launch_server(port, workers, log_dir)
        try:
            bhttp.wait_server(server, workers)
            bhttp.warm_routes(url, api_key, workers, routes)
            benchlib.flush_broker()
            db.execute("ANALYZE")
            for rep in range(reps):
                for conns in conn_counts:
                    for route in routes:
                        got = bhttp.measure_phase(url, server, db, route, conns, seconds,
                                                  api_key, f"r{rep}-c{conns}-{route}")  # fmt: skip
                        results.setdefault((route, conns), []).append(got)
                        print(f"  rep {rep + 1} c{conns:<3} http {route:<8} {got['per_s']:8.0f} "
                              f"req/s  p99 {got['p99_us'] / 1e3:6.1f} ms  errors "
                              f"{got['error_total']}  (load {_load()})", flush=True)  # fmt: skip
                    benchlib.flush_broker()
        finally:
            server.stop()

    def med(route: str, conns: int, field: str) -> float:
        return benchlib.median([r[field] for r in results[(route, conns)]])

    out: dict = {"seconds": seconds, "reps": reps, "workers": workers}
    for conns in conn_counts:
        row = {}
        for route in routes:
            row[route] = {
                "per_s": round(med(route, conns, "per_s"), 1),
                "p99_ms": round(med(route, conns, "p99_us") / 1e3, 2),
                "errors": sum(r["error_total"] for r in results[(route, conns)]),
                "backend_cpu_ms": round(med(route, conns, "backend_cpu_ms"), 3),
                "worker_cpu_ms": round(med(route, conns, "worker_cpu_ms"), 3),
            }
        row["ratio_to_floor"] = round(row["tickets"]["per_s"] / row["floor"]["per_s"], 3)
        out[f"c{conns}"] = row
    out["load"] = [load0, _load()]
    return out


# --- end to end with 1, 2 and 4 worker processes ------------------------------------------------

SYSTEMS_E2E = ("claimcheck", "celery", "procrastinate")


def run_e2e(worker_counts: list[int], e: int, reps: int, log_dir: Path, timeout: float) -> dict:
    """bench/turns.py's pipeline and raw Celery rounds and bench/peers.py's
    Procrastinate round, each worker count with its own workers."""
    import logging

    import psycopg

    from bench import peer_apps, peers, turns
    from endpoints.services import create_endpoint

    runner = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}
    for i in range(E2E_ENDPOINTS):
        create_endpoint(address=turns.endpoint_address(i), runner=runner)
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    benchlib.create_empty_database(peer_apps.PC_DB)
    peer_apps.pc_app.open()
    peer_apps.pc_app.schema_manager.apply_schema()
    pc_db = psycopg.connect(peer_apps.PC_URL, autocommit=True)
    runs: dict[str, dict[int, list[float]]] = {s: {c: [] for c in worker_counts}
                                               for s in SYSTEMS_E2E}  # fmt: skip
    cpu: dict[int, list[dict]] = {c: [] for c in worker_counts}
    loads: dict[int, list[float]] = {}
    try:
        for conc in worker_counts:
            workers = [
                benchlib.Worker("bench-turns", "config", "turns,control", conc, log_dir),
                benchlib.Worker("bench-noop", "bench.noop_app", "bench_noop", conc,
                                log_dir),
                benchlib.Proc(f"bench-procrastinate-c{conc}",
                              [sys.executable, "-m", "procrastinate",
                               "--app=bench.peer_apps.pc_app", "worker",
                               f"--concurrency={conc}", f"--queues={peer_apps.E2E_QUEUE}"],
                              log_dir, marker=b"Starting worker"),
            ]  # fmt: skip
            try:
                for w in workers:
                    w.wait_ready(timeout=120)
                turns.pipeline_round(f"warm-c{conc}", 2 * E2E_ENDPOINTS, E2E_ENDPOINTS, timeout)
                turns.floor_round(4 * conc, timeout)
                peers.pc_round(f"warm-c{conc}", 4 * conc, pc_db, timeout)
                loads[conc] = [_load()]
                for rep in range(reps):
                    tag = f"c{conc}-r{rep}"
                    got = {
                        "claimcheck": turns.pipeline_round(tag, e, E2E_ENDPOINTS, timeout),
                        "celery": turns.floor_round(e, timeout),
                        "procrastinate": peers.pc_round(tag, e, pc_db, timeout),
                    }
                    bad = {k: v for k, v in got["claimcheck"]["states"].items()
                           if k != "succeeded"}  # fmt: skip
                    if bad:
                        raise SystemExit(f"end to end {tag}: tickets not succeeded: {bad}")
                    for system in SYSTEMS_E2E:
                        runs[system][conc].append(got[system]["per_s"])
                    cpu[conc].append(got["claimcheck"]["cpu_ms"])
                    print(f"  rep {rep + 1} -c {conc} e2e "
                          + "  ".join(f"{s} {got[s]['per_s']:.0f}/s" for s in SYSTEMS_E2E)
                          + f"  (load {_load()})", flush=True)  # fmt: skip
                loads[conc].append(_load())
            finally:
                for w in workers:
                    w.stop()
                benchlib.flush_broker()
    finally:
        pc_db.close()
        peer_apps.pc_app.close()
        benchlib.drop_database_named(peer_apps.PC_DB)
    out: dict = {"e": e, "reps": reps, "endpoints": E2E_ENDPOINTS}
    for conc in worker_counts:
        med = {s: benchlib.median(runs[s][conc]) for s in SYSTEMS_E2E}
        cc = runs["claimcheck"][conc]
        out[f"c{conc}"] = {
            "per_s": {s: round(v, 1) for s, v in med.items()},
            "runs": {s: [round(x, 1) for x in runs[s][conc]] for s in SYSTEMS_E2E},
            "ratio": {f"claimcheck_vs_{p}": round(med["claimcheck"] / med[p], 3)
                      for p in ("celery", "procrastinate")},
            "worst_rep": {f"claimcheck_vs_{p}": round(min(a / b for a, b in
                                                          zip(cc, runs[p][conc], strict=True)), 3)
                          for p in ("celery", "procrastinate")},
            "cpu_ms_per_ticket": {k: round(benchlib.median([c[k] for c in cpu[conc]]), 3)
                                  for k in cpu[conc][0]},
            "load": loads.get(conc, []),
        }  # fmt: skip
    return out


def report_stack(stack: dict) -> None:
    if "processes" in stack:
        got = stack["processes"]
        print(f"\nthrough the stack, median of {got['reps']} ({got['seconds']:g} s a point); "
              f"load {got['load'][0]} -> {got['load'][1]}")  # fmt: skip
        for n, r in got["ratio"].items():
            per = {s: got["per_s"][s][n] for s in SYSTEMS_PROCESSES}
            print(f"  {n:>2} processes: admit_ticket {per['claimcheck']}/s, Procrastinate defer "
                  f"{per['procrastinate']}/s, psycopg insert {per['insert']}/s; admit / "
                  f"Procrastinate {r['claimcheck_vs_procrastinate']:.2f}, / insert "
                  f"{r['claimcheck_vs_insert']:.2f}")  # fmt: skip
    if "http" in stack:
        got = stack["http"]
        print(f"HTTP, {got['workers']} gunicorn workers, {got['seconds']:g} s a phase; "
              f"load {got['load'][0]} -> {got['load'][1]}")  # fmt: skip
        for key, row in got.items():
            if key.startswith("c") and isinstance(row, dict):
                print(
                    f"  {key:>4}: tickets {row['tickets']['per_s']:.0f}/s (errors "
                    f"{row['tickets']['errors']}, db CPU {row['tickets']['backend_cpu_ms']} ms)"
                    f", floor {row['floor']['per_s']:.0f}/s (db CPU "
                    f"{row['floor']['backend_cpu_ms']} ms); ratio {row['ratio_to_floor']:.2f}"
                )
    if "e2e" in stack:
        got = stack["e2e"]
        print(f"end to end, {got['e']} a round, median of {got['reps']}:")
        for key, row in got.items():
            if key.startswith("c") and isinstance(row, dict):
                per, worst = row["per_s"], row["worst_rep"]
                print(f"  -{key}: claimcheck {per['claimcheck']:.0f}/s, Celery "
                      f"{per['celery']:.0f}/s, Procrastinate {per['procrastinate']:.0f}/s; worst "
                      f"rep / Procrastinate {worst['claimcheck_vs_procrastinate']:.2f}, / Celery "
                      f"{worst['claimcheck_vs_celery']:.2f}; load {row['load']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-T", type=int, default=8, help="seconds a point")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    parser.add_argument("--seed", type=int, default=20_000, help="finished tickets first")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="through the stack, after the database: " + ",".join(PARTS),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the reduced size of make bench-all: one repetition, short points",
    )
    parser.add_argument("--proc-s", type=float, default=8.0, help="seconds a processes point")
    parser.add_argument("--processes", default=",".join(map(str, PROCESSES)))
    parser.add_argument("--http-s", type=float, default=8.0, help="seconds an HTTP phase")
    parser.add_argument("--connections", default=",".join(map(str, CONNECTIONS)))
    parser.add_argument("-e", type=int, default=500, help="units of work an end-to-end round")
    parser.add_argument(
        "--workers", default=",".join(map(str, WORKERS)), help="worker processes (-c) end to end"
    )
    parser.add_argument("--e2e-reps", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        # bench_all's whole run stays near 20 minutes: short points, and end
        # to end only at the worker count its targets name.
        args.proc_s, args.http_s, args.e, args.e2e_reps = 3.0, 3.0, 200, 2
        if args.workers == parser.get_default("workers"):
            args.workers = "2"
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; known: {PARTS}")
    processes = [int(c) for c in args.processes.split(",")]
    conn_counts = [int(c) for c in args.connections.split(",")]
    worker_counts = [int(c) for c in args.workers.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    limit = 60 + args.reps * len(clients) * 6 * (args.T + 2)
    limit += ("processes" in parts) * args.reps * len(processes) * 3 * (args.proc_s + 20)
    limit += ("http" in parts) * (120 + args.reps * len(conn_counts) * 2 * (args.http_s + 3))
    limit += ("e2e" in parts) * len(worker_counts) * (150 + args.e2e_reps * 3 * args.e / 20)
    benchlib.start_wall_clock(limit_s=max(900, limit))
    setup(args.seed)
    stack: dict = {}
    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-concurrency-"))
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
        stack["db_load"] = [round(load0, 2), _load()]
        if "processes" in parts:
            stack["processes"] = run_processes(processes, args.proc_s, args.reps)
        if "http" in parts:
            stack["http"] = run_http(conn_counts, args.http_s, args.reps, log_dir)
        if "e2e" in parts:
            stack["e2e"] = run_e2e(worker_counts, args.e, args.e2e_reps, log_dir, 150.0)
    except BaseException:
        print(f"logs kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        if not args.keep:
            benchlib.drop_database_named(benchlib.DB_NAME)
            benchlib.drop_database_named(PC_DB + benchlib.SUFFIX)
            benchlib.drop_database_named(DBOS_DB + benchlib.SUFFIX)
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
            "admit_vs_dbos": round(med["admit"][c] / med["dbos"][c], 3),
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
    summary.update(stack)
    report_stack(stack)
    if not args.keep:
        shutil.rmtree(log_dir, ignore_errors=True)
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
