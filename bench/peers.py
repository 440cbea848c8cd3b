"""Claimcheck against two PostgreSQL-backed peers, DBOS and Procrastinate, on
the same PostgreSQL in the same run: admission, and no-op work end to end.

    uv sync --group bench    # the peers are an optional dependency group
    .venv/bin/python bench/peers.py [-n 1000] [--reps 3] [--block 50] [-e 500] [-c 2]

Each system has a scratch database of its own: ``claimcheck_bench`` (migrated
and seeded as bench/admission.py does it), ``claimcheck_bench_dbos`` (DBOS's
system database) and ``claimcheck_bench_procrastinate`` (its schema applied),
all created at the start and dropped at the end. Redis db 11 as the other
benchmarks. The peers' no-op units of work are in bench/peer_apps.py.

(a) admission, single-threaded, autocommit, interleaved in blocks of
``--block`` iterations, the order rotating from block to block (as
bench/admission.py):

- ``claimcheck``: ``admit_ticket`` with a new ``dedupe_key`` (marks the
  ticket owed and notifies the dispatcher, as in production: no broker
  publish on the request path); ``claimcheck_nopublish``: the same with
  ``send_task`` replaced by a no-op (now the same work);
  ``claimcheck_dup``: the same keys again;
- floor ``raw_cte``: admission's own statement through psycopg (prepared);
- ``dbos``: ``queue.enqueue(noop, input)`` under ``SetWorkflowID(key)``, the
  dedupe key as the workflow id (DBOS's idempotency key); ``dbos_dup``: the
  same ids again (DBOS returns the existing workflow's handle);
- ``procrastinate``: ``noop.configure(queueing_lock=key).defer(input)``;
  ``procrastinate_dup``: the same locks again (refused with
  ``AlreadyEnqueued`` while the job waits: Procrastinate's dedupe).

Every system gets the same input object per key. Nothing consumes the
admitted work.

(b) end to end, N no-op units of work through a worker of concurrency C
(default 2), repetitions alternating the four:

- ``claimcheck``: the turn pipeline exactly as bench/turns.py measures it (N
  tickets over K = 20 endpoints whose runner is ``runtime.demo.echo``, inline,
  ``celery -A config worker -c C``; clock from the first admission to the last
  ``finished_at``);
- ``celery``: raw Celery no-op tasks (bench/noop_app.py), the floor of turns.py;
- ``dbos``: N no-op workflows enqueued on a queue with ``worker_concurrency``
  C, run by a DBOS process of their own (bench/peer_apps.py); its queue is
  polled every ``--dbos-poll`` s (DBOS's default is 1 s, which would cap it at
  C workflows a second); the clock runs to the latest ``updated_at`` of the N
  workflows;
- ``procrastinate``: N no-op jobs deferred (a queueing lock each) and run by
  ``procrastinate worker --concurrency C`` (LISTEN/NOTIFY); the clock runs to
  the latest ``succeeded`` event of the N jobs.

The Celery and Procrastinate workers stay up for the whole phase (idle, a
blocking read); the DBOS worker polls its queue even when idle, so it runs
only during its own rounds (its start-up is outside the clock: it is ready
once it has run a workflow).

A figure is the median over repetitions; the ratios are Claimcheck / peer.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import admission as adm  # noqa: E402
from bench import benchlib, turns  # noqa: E402

ADMISSION_PHASES = [
    "claimcheck",
    "claimcheck_nopublish",
    "claimcheck_dup",
    "raw_cte",
    "dbos",
    "dbos_dup",
    "procrastinate",
    "procrastinate_dup",
]
# The interleaving's groups (benchlib.block_order): a duplicate phase runs
# after the phase whose keys it repeats.
ADMISSION_GROUPS = [
    ["claimcheck", "claimcheck_dup"],
    ["claimcheck_nopublish"],
    ["raw_cte"],
    ["dbos", "dbos_dup"],
    ["procrastinate", "procrastinate_dup"],
]
assert sorted(p for g in ADMISSION_GROUPS for p in g) == sorted(ADMISSION_PHASES)
E2E_SYSTEMS = ["claimcheck", "celery", "dbos", "procrastinate"]


# --- (a) admission ------------------------------------------------------------------------------


def dbos_enqueue_loop(queue, keys: list[str]) -> float:
    """New ids, or (the duplicate phase) ids that exist: DBOS then returns the
    existing workflow's handle (``check_admitted`` counts one row per id)."""
    from dbos import SetWorkflowID

    from bench.peer_apps import dbos_noop

    started = time.perf_counter()
    for key in keys:
        with SetWorkflowID(key):
            handle = queue.enqueue(dbos_noop, adm.ticket_input(key))
        assert handle.workflow_id == key
    return time.perf_counter() - started


def pc_defer_loop(keys: list[str]) -> float:
    from bench.peer_apps import ADMIT_QUEUE, pc_noop

    started = time.perf_counter()
    for key in keys:
        job_id = pc_noop.configure(queueing_lock=key, queue=ADMIT_QUEUE).defer(
            payload=adm.ticket_input(key)
        )
        assert job_id
    return time.perf_counter() - started


def pc_duplicate_loop(keys: list[str]) -> float:
    from procrastinate.exceptions import AlreadyEnqueued

    from bench.peer_apps import ADMIT_QUEUE, pc_noop

    started = time.perf_counter()
    for key in keys:
        try:
            pc_noop.configure(queueing_lock=key, queue=ADMIT_QUEUE).defer(
                payload=adm.ticket_input(key)
            )
        except AlreadyEnqueued:
            continue
        raise AssertionError(f"procrastinate deferred a second job for {key}")
    return time.perf_counter() - started


def admission_repetition(tag: str, n: int, block: int, raw, dbos_queue) -> dict[str, float]:
    keys = {p: [f"{tag}-{p}-{i}" for i in range(n)] for p in ADMISSION_PHASES}
    cte_rows = adm.cte_params(keys["raw_cte"])
    loops: dict[str, Callable[[slice], float]] = {
        "claimcheck": lambda s: adm.admit_loop(keys["claimcheck"][s]),
        "claimcheck_nopublish": lambda s: adm.admit_nopublish_loop(keys["claimcheck_nopublish"][s]),
        "claimcheck_dup": lambda s: adm.duplicate_loop(keys["claimcheck"][s]),
        "raw_cte": lambda s: adm.raw_cte_loop(raw, cte_rows[s]),
        "dbos": lambda s: dbos_enqueue_loop(dbos_queue, keys["dbos"][s]),
        "dbos_dup": lambda s: dbos_enqueue_loop(dbos_queue, keys["dbos"][s]),
        "procrastinate": lambda s: pc_defer_loop(keys["procrastinate"][s]),
        "procrastinate_dup": lambda s: pc_duplicate_loop(keys["procrastinate"][s]),
    }
    seconds = dict.fromkeys(ADMISSION_PHASES, 0.0)
    for number, start in enumerate(range(0, n, block)):
        part = slice(start, min(start + block, n))
        for phase in benchlib.block_order(ADMISSION_GROUPS, number):
            seconds[phase] += loops[phase](part)
    # Admission publishes nothing (the dispatcher does, off the request path;
    # none runs in this phase): like the peers, its queue is the database.
    published = benchlib.broker_depth("turns")
    assert published == 0, f"admission published {published} messages"
    benchlib.flush_broker()
    return {p: benchlib.rate(n, s) for p, s in seconds.items()}


def check_admitted(tag: str, n: int, dbos_db, pc_db) -> None:
    """Every peer admission is one row, duplicates none."""
    from bench.peer_apps import ADMIT_QUEUE

    wf = dbos_db.execute(
        "SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE %s",
        (f"{tag}-dbos-%",),
    ).fetchone()[0]
    jobs = pc_db.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND queueing_lock LIKE %s",
        (ADMIT_QUEUE, f"{tag}-procrastinate-%"),
    ).fetchone()[0]
    assert wf == n and jobs == n, f"{tag}: {wf} DBOS workflows and {jobs} jobs, expected {n}"


# --- (b) end to end -----------------------------------------------------------------------------


def dbos_round(tag: str, n: int, queue, dbos_db, timeout: float) -> dict:
    from dbos import SetWorkflowID

    from bench.peer_apps import dbos_noop

    started_at = time.time()
    clock = time.perf_counter()
    for i in range(n):
        with SetWorkflowID(f"{tag}-{i}"):
            queue.enqueue(dbos_noop, {"i": i})
    enqueue_s = time.perf_counter() - clock

    def done() -> bool:
        row = dbos_db.execute(
            "SELECT count(*) FROM dbos.workflow_status "
            "WHERE workflow_uuid LIKE %s AND status = 'SUCCESS'",
            (f"{tag}-%",),
        ).fetchone()
        return row[0] == n

    benchlib.wait_for(done, timeout=timeout, interval=0.25, what=f"{n} DBOS workflows ({tag})")
    # updated_at: epoch milliseconds of the workflow's last status write (SUCCESS).
    last_ms = dbos_db.execute(
        "SELECT max(updated_at) FROM dbos.workflow_status WHERE workflow_uuid LIKE %s",
        (f"{tag}-%",),
    ).fetchone()[0]
    seconds = last_ms / 1000 - started_at
    return {"seconds": seconds, "per_s": benchlib.rate(n, seconds), "enqueue_s": enqueue_s}


def pc_round(tag: str, n: int, pc_db, timeout: float) -> dict:
    from bench.peer_apps import pc_noop

    started_at = time.time()
    clock = time.perf_counter()
    ids = [pc_noop.configure(queueing_lock=f"{tag}-{i}").defer(payload={"i": i}) for i in range(n)]
    defer_s = time.perf_counter() - clock

    def done() -> bool:
        row = pc_db.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE id = ANY(%s) AND status = 'succeeded'",
            (ids,),
        ).fetchone()
        return row[0] == n

    benchlib.wait_for(done, timeout=timeout, interval=0.25, what=f"{n} Procrastinate jobs ({tag})")
    last = pc_db.execute(
        "SELECT max(at) FROM procrastinate_events WHERE job_id = ANY(%s) AND type = 'succeeded'",
        (ids,),
    ).fetchone()[0]
    seconds = last.timestamp() - started_at
    return {"seconds": seconds, "per_s": benchlib.rate(n, seconds), "defer_s": defer_s}


def start_dbos_worker(conc: int, poll: float, log_dir: Path, tag: str) -> benchlib.Proc:
    worker = benchlib.Proc(
        f"bench-dbos-{tag}",
        [sys.executable, "-m", "bench.peer_apps", "dbos-worker",
         "-c", str(conc), "--poll", str(poll)],
        log_dir,
    )  # fmt: skip
    worker.wait_ready()
    return worker


# --- set-up and report --------------------------------------------------------------------------


def setup_peers(conc: int, poll: float):
    """Create the peers' databases; launch DBOS in this process (it dequeues
    nothing here) and open Procrastinate's synchronous connector."""
    from bench import peer_apps

    # Django's logging config sends INFO to stderr: Procrastinate would log
    # every defer ("Deferred 1 job"), a cost Claimcheck's admission does not pay.
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    benchlib.create_empty_database(peer_apps.DBOS_DB)
    benchlib.create_empty_database(peer_apps.PC_DB)
    peer_apps.launch_dbos(executor_id="bench-enqueuer", listen=[])
    admit_queue, e2e_queue = peer_apps.register_queues(concurrency=conc, poll_s=poll)
    peer_apps.pc_app.open()
    peer_apps.pc_app.schema_manager.apply_schema()
    return admit_queue, e2e_queue


def teardown_peers() -> None:
    from bench import peer_apps

    try:
        from dbos import DBOS

        DBOS.destroy()
    finally:
        peer_apps.pc_app.close()
        benchlib.drop_database_named(peer_apps.DBOS_DB)
        benchlib.drop_database_named(peer_apps.PC_DB)


def analyze(*conns) -> None:
    for conn in conns:
        conn.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="admissions per phase (<= 10000)")
    parser.add_argument("--block", type=int, default=50, help="admissions per interleaved block")
    parser.add_argument("--warmup", type=int, default=200, help="admissions per phase, untimed")
    parser.add_argument("-e", type=int, default=500, help="units of work per end-to-end round")
    parser.add_argument("-k", type=int, default=20, help="Claimcheck endpoints (as turns.py)")
    parser.add_argument("-c", "--concurrency", type=int, default=2, help="worker concurrency")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (<= 7)")
    parser.add_argument("--dbos-poll", type=float, default=0.01, help="DBOS queue polling, s")
    parser.add_argument("--timeout", type=float, default=150.0, help="deadline per round, s")
    parser.add_argument("--skip-admission", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the databases and logs")
    args = parser.parse_args()
    n, e, reps = min(args.n, 10_000), min(args.e, 5000), min(args.reps, 7)
    k, conc, block = max(1, min(args.k, 200)), max(1, min(args.concurrency, 8)), max(1, args.block)
    benchlib.start_wall_clock(1500)

    import psycopg

    benchlib.recreate_database()
    benchlib.flush_broker()
    benchlib.setup_django()

    from django.db import connection

    from bench import peer_apps
    from endpoints.services import create_endpoint

    # Inline, as turns.py's pipeline (the peers run their no-ops in process
    # too); the default, the slot's warm turn process, is turns.py's "isolated".
    runner = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}
    endpoint = create_endpoint(address=adm.ADDRESS, runner=runner)
    for i in range(k):
        create_endpoint(address=turns.endpoint_address(i), runner=runner)
    benchlib.seed_ledger(endpoint.id)

    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-peers-"))
    raw = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    dbos_db = pc_db = None
    workers: list[benchlib.Proc] = []
    a_rates: dict[str, list[float]] = {p: [] for p in ADMISSION_PHASES}
    e2e: dict[str, list[dict]] = {s: [] for s in E2E_SYSTEMS}
    try:
        admit_queue, e2e_queue = setup_peers(conc, args.dbos_poll)
        dbos_db = psycopg.connect(f"{peer_apps.DBOS_URL}", autocommit=True)
        pc_db = psycopg.connect(f"{peer_apps.PC_URL}", autocommit=True)

        if not args.skip_admission:
            admission_repetition("warm", args.warmup, block, raw, admit_queue)
            analyze(raw, dbos_db, pc_db)
            for rep in range(reps):
                got = admission_repetition(f"r{rep}", n, block, raw, admit_queue)
                check_admitted(f"r{rep}", n, dbos_db, pc_db)
                for phase, value in got.items():
                    a_rates[phase].append(value)
                print(
                    f"  admission rep {rep + 1}/{reps}: "
                    + "  ".join(f"{p} {got[p]:.0f}/s" for p in ADMISSION_PHASES),
                    flush=True,
                )

        if not args.skip_e2e:
            workers.append(benchlib.Worker("bench-turns", "config", "turns,control", conc, log_dir))
            workers.append(
                benchlib.Worker("bench-noop", "bench.noop_app", "bench_noop", conc, log_dir)
            )
            workers.append(
                benchlib.Proc(
                    "bench-procrastinate",
                    [
                        sys.executable,
                        "-m",
                        "procrastinate",
                        "--app=bench.peer_apps.pc_app",
                        "worker",
                        f"--concurrency={conc}",
                        f"--queues={peer_apps.E2E_QUEUE}",
                    ],
                    log_dir,
                    marker=b"Starting worker",
                )  # fmt: skip
            )
            for w in workers:
                w.wait_ready()
            # Warm up every path: imports, connections, a few units of work each.
            turns.pipeline_round("warm", 2 * k, k, args.timeout)
            turns.floor_round(4 * conc, args.timeout)
            pc_round("warm", 4 * conc, pc_db, args.timeout)
            dbos_worker = start_dbos_worker(conc, args.dbos_poll, log_dir, "warm")
            try:
                dbos_round("warm", 4 * conc, e2e_queue, dbos_db, args.timeout)
            finally:
                dbos_worker.stop()
            for rep in range(reps):
                got = {
                    "claimcheck": turns.pipeline_round(f"e{rep}", e, k, args.timeout),
                    "celery": turns.floor_round(e, args.timeout),
                    "procrastinate": pc_round(f"e{rep}", e, pc_db, args.timeout),
                }
                dbos_worker = start_dbos_worker(conc, args.dbos_poll, log_dir, f"e{rep}")
                try:
                    got["dbos"] = dbos_round(f"e{rep}", e, e2e_queue, dbos_db, args.timeout)
                finally:
                    dbos_worker.stop()
                for system in E2E_SYSTEMS:
                    e2e[system].append(got[system])
                states = got["claimcheck"]["states"]
                print(
                    f"  end-to-end rep {rep + 1}/{reps}: "
                    + "  ".join(f"{s} {got[s]['per_s']:.0f}/s" for s in E2E_SYSTEMS)
                    + f"  (claimcheck tickets: {states})",
                    flush=True,
                )
    except BaseException:
        print(f"logs kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        for w in workers:
            w.stop()
        for conn in (raw, dbos_db, pc_db):
            if conn is not None:
                conn.close()
        benchlib.flush_broker()
        connection.close()
        if not args.keep:
            teardown_peers()
            benchlib.drop_database()

    summary: dict = {"bench": "peers", "n": n, "e": e, "k": k, "concurrency": conc,
                     "reps": reps, "dbos_poll_s": args.dbos_poll}  # fmt: skip
    if not args.skip_admission:
        med = {p: benchlib.median(v) for p, v in a_rates.items()}

        def ratio(a: str, b: str) -> float:
            return round(med[a] / med[b], 3)

        print(
            f"admission (new key): claimcheck {med['claimcheck']:.0f}/s "
            f"(publish off {med['claimcheck_nopublish']:.0f}/s), "
            f"DBOS enqueue {med['dbos']:.0f}/s, Procrastinate defer {med['procrastinate']:.0f}/s; "
            f"raw CTE floor {med['raw_cte']:.0f}/s"
        )
        print(
            f"  ratio claimcheck / DBOS {ratio('claimcheck', 'dbos'):.2f}, "
            f"claimcheck / Procrastinate {ratio('claimcheck', 'procrastinate'):.2f}; "
            f"publish off: / DBOS {ratio('claimcheck_nopublish', 'dbos'):.2f}, "
            f"/ Procrastinate {ratio('claimcheck_nopublish', 'procrastinate'):.2f}; "
            f"claimcheck / raw CTE {ratio('claimcheck', 'raw_cte'):.2f}, "
            f"publish off / raw CTE {ratio('claimcheck_nopublish', 'raw_cte'):.2f}"
        )
        print(
            f"admission (same key again): claimcheck {med['claimcheck_dup']:.0f}/s, "
            f"DBOS {med['dbos_dup']:.0f}/s, Procrastinate {med['procrastinate_dup']:.0f}/s "
            f"(refused with AlreadyEnqueued); ratio claimcheck / DBOS "
            f"{ratio('claimcheck_dup', 'dbos_dup'):.2f}, claimcheck / Procrastinate "
            f"{ratio('claimcheck_dup', 'procrastinate_dup'):.2f}"
        )
        summary["admission_per_s"] = {p: round(v, 1) for p, v in med.items()}
        summary["admission_per_s_runs"] = {p: [round(x, 1) for x in v] for p, v in a_rates.items()}
        summary["admission_ratio"] = {
            "claimcheck_vs_dbos": ratio("claimcheck", "dbos"),
            "claimcheck_vs_procrastinate": ratio("claimcheck", "procrastinate"),
            "nopublish_vs_dbos": ratio("claimcheck_nopublish", "dbos"),
            "nopublish_vs_procrastinate": ratio("claimcheck_nopublish", "procrastinate"),
            "claimcheck_vs_raw_cte": ratio("claimcheck", "raw_cte"),
            "nopublish_vs_raw_cte": ratio("claimcheck_nopublish", "raw_cte"),
            "dup_vs_dbos_dup": ratio("claimcheck_dup", "dbos_dup"),
            "dup_vs_procrastinate_dup": ratio("claimcheck_dup", "procrastinate_dup"),
        }
    if not args.skip_e2e:
        med_e = {s: benchlib.median([r["per_s"] for r in e2e[s]]) for s in E2E_SYSTEMS}
        failed = sum(
            c for r in e2e["claimcheck"] for s, c in r["states"].items() if s != "succeeded"
        )

        def ratio_e(a: str, b: str) -> float:
            return round(med_e[a] / med_e[b], 3)

        print(
            f"end to end (-c {conc}, {e} per round): claimcheck turn pipeline "
            f"{med_e['claimcheck']:.0f} tickets/s, raw Celery no-op {med_e['celery']:.0f} tasks/s, "
            f"DBOS {med_e['dbos']:.0f} workflows/s (poll {args.dbos_poll:g} s), "
            f"Procrastinate {med_e['procrastinate']:.0f} jobs/s"
        )
        print(
            f"  ratio claimcheck / raw Celery {ratio_e('claimcheck', 'celery'):.2f}, "
            f"/ DBOS {ratio_e('claimcheck', 'dbos'):.2f}, "
            f"/ Procrastinate {ratio_e('claimcheck', 'procrastinate'):.2f}"
        )
        if failed:
            print(f"WARNING: {failed} Claimcheck ticket(s) did not succeed")
        summary["e2e_per_s"] = {s: round(v, 1) for s, v in med_e.items()}
        summary["e2e_per_s_runs"] = {s: [round(r["per_s"], 1) for r in e2e[s]] for s in E2E_SYSTEMS}
        summary["e2e_ratio"] = {
            "claimcheck_vs_celery": ratio_e("claimcheck", "celery"),
            "claimcheck_vs_dbos": ratio_e("claimcheck", "dbos"),
            "claimcheck_vs_procrastinate": ratio_e("claimcheck", "procrastinate"),
        }
        summary["not_succeeded"] = failed
    print(json.dumps(summary, separators=(",", ":")))
    if args.keep:
        print(f"logs: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
