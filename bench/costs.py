"""What one ticket costs the database and the worker, counted rather than
timed: statements, commits, WAL bytes, buffers and CPU time per operation.

Four operations, each N times in this process on ``claimcheck_bench_costs``
(seeded with 20,000 finished tickets first, like admission.py):

- `admission`: `admit_ticket` of a root ticket with a new dedupe key;
- `turn`: `run_ticket` of such a ticket: start, the `runtime.demo.echo`
  runner inline, finish (the finish opens the ticket's pull delivery);
- `turn_in_a_slot`: the same as a worker's pool process runs it, its
  worker registered: the start names the process's slot on the turn and
  the finish lets go of it (tickets/turns/slots.py);
- `turn_with_callback`: `run_ticket` of a child with `return_to`: the
  finish also admits the callback ticket;
- `turn_with_webhook`: `run_ticket` of a root whose requester names a
  webhook: the finish opens a webhook delivery;
- `delivery`: `tickets.delivery.send` of that delivery to a receiver on
  127.0.0.1 answering 204.

The callback's own cost is `turn_with_callback` minus `turn`; its ticket is
then an admission and a turn like any other.

Per operation, from the database's side (load-independent counts):

- **statements**: what Django sent (an execute wrapper);
- **commits**: `pg_stat_database.xact_commit` of this database (every
  autocommit statement is a transaction of its own; read-only ones count);
- **WAL bytes**: `pg_waldump` over the LSN range of the loop, keeping only
  the records of this database's relations and the commit records of the
  transactions that wrote them (the WAL is the cluster's, shared with the
  other engineers' databases; ``pg_stat_wal`` would count theirs too).
  Full-page images are counted apart: their share depends on how recently a
  checkpoint ran, so the figure without them is the steady one;
- **buffers**: `blks_hit + blks_read` of `pg_stat_database` (8 KB pages
  touched), and the rows inserted, updated and deleted;
- **CPU**: the PostgreSQL backend's user+system time (`/proc/<pid>/stat`;
  WAL writer, checkpointer and autovacuum not included) and the calling
  thread's own CPU time (`time.thread_time`) for the worker's side.

Then **a pull ticket with worker processes** (``--workers 2,4``): N tickets
admitted by `admit_ticket` in this process over 20 endpoints (one turn at a
time each), run by a real worker (`celery -A config worker -c C`, started
through bench/counted_celery.py so its processes count their statements),
counted over the whole window, admission to the last finish: statements
(this process's and the worker's), transactions and write commits, WAL
bytes, notifications (those from a session other than a waker's are the
ones sent inside a write transaction), rows, buffers, and the CPU of every
backend of the database (sampled from `/proc` every 0.1 s; WAL writer and
checkpointer apart). The worker's idle sweeps in the window count too.

`pg_stat_statements` is not used: it needs `shared_preload_libraries` and a
restart of the shared server. Autovacuum is switched off on this database's
tables while measuring (its reads would count as ours). Broker publishes are
replaced by a counter (what the worker would send to Redis).
"""

from __future__ import annotations

import argparse
import json
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

DB = "claimcheck_bench_costs"
ADDRESS = "bench.costs"
HOME = "bench.costs-home"
ROOTS = "bench.costs-roots"
WALDUMP = "/usr/lib/postgresql/15/bin/pg_waldump"
RELATIONS_SHOWN = 40
OPERATIONS = [
    "admission",
    "turn",
    "turn_in_a_slot",
    "turn_with_callback",
    "turn_with_webhook",
    "delivery",
]
# The endpoints of the worker phase (one turn at a time each).
WORKER_ENDPOINTS = 20
WAKER = "claimcheck waker"  # core/wakes.py's application_name
RECORD = re.compile(r"len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+),.*?desc: (\S+)(.*)$")
# A record's first block reference: the relation (its filenode) it writes.
BLOCK_REF = re.compile(r"rel \d+/(\d+)/(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local PostgreSQL backend."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wal_of_database(start: str, end: str, dboid: int, wal_dir: str) -> dict[str, int]:
    """Bytes and records of the WAL between two LSNs that belong to one
    database: records naming its relations, plus the commit records of the
    transactions that wrote them."""
    done = subprocess.run(
        [WALDUMP, "-p", wal_dir, "-s", start, "-e", end],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        raise RuntimeError(f"pg_waldump {start}..{end} failed: {done.stderr.strip()[:300]}")
    out = done.stdout
    marker = f"/{dboid}/"
    mine: set[str] = set()
    commits: list[tuple[str, int]] = []
    total = fpi_records = fpi_bytes = records = 0
    # Bytes without full-page images by the filenode a record writes first.
    by_node: dict[int, int] = {}
    for line in out.splitlines():
        m = RECORD.search(line)
        if not m:
            continue
        rec, tot, tx, desc, rest = int(m[1]), int(m[2]), m[3], m[4], m[5]
        if line.startswith("rmgr: Transaction") and desc == "COMMIT":
            commits.append((tx, tot))
            continue
        if marker not in rest:
            continue
        mine.add(tx)
        records += 1
        total += tot
        fpi = tot - rec if "FPW" in rest else 0
        if fpi:
            fpi_records += 1
            fpi_bytes += fpi
        ref = BLOCK_REF.search(rest)
        if ref and ref[1] == str(dboid):
            node = int(ref[2])
            by_node[node] = by_node.get(node, 0) + tot - fpi
    commit_records = [tot for tx, tot in commits if tx in mine]
    total += sum(commit_records)
    return {
        "bytes": total,
        "bytes_without_fpi": total - fpi_bytes,
        "records": records + len(commit_records),
        "fpi": fpi_records,
        "commit_records": len(commit_records),
        "by_node": by_node,
    }


def relation_names(db) -> dict[int, str]:
    """Filenode -> relation name (tables, indexes, TOAST) of the database."""
    return {
        node: name
        for node, name in db.execute(
            "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c "
            "WHERE pg_relation_filenode(c.oid) IS NOT NULL"
        ).fetchall()
    }


def print_relations(label: str, by_node: dict[int, int], names: dict[int, str], n: int) -> None:
    """The relations whose WAL (without full-page images) makes up an
    operation's, most first: where its writes go, index by index."""
    total = sum(by_node.values()) or 1
    print(f"  WAL by relation, {label} (bytes per operation, no full-page images):")
    for node, size in sorted(by_node.items(), key=lambda kv: -kv[1])[:RELATIONS_SHOWN]:
        name = names.get(node, f"filenode {node}")
        print(f"    {name:<48}{size / n:9.0f}  {100 * size / total:5.1f} %")


class Receiver:
    """A webhook receiver on 127.0.0.1 answering 204 to every POST."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Meter:
    """Statements sent by this process during one measured loop, counted at
    psycopg's cursor (Django's cursors and the raw ones of the fast paths
    alike; ``executemany`` counts once per row set)."""

    def __init__(self):
        self.statements = 0
        # The waker's statements (core/wakes.py: the NOTIFYs after commit, on
        # a session and thread of their own), counted apart: each is one
        # read-only transaction off the caller's path, and under load one
        # serves many wakes.
        self.wakes = 0
        # Statements that may NOTIFY (their text names pg_notify; a branch
        # may skip it): an upper bound, beside the notifications counted.
        self.notifying = 0

    def __enter__(self):
        import psycopg

        meter = self
        plain, many = psycopg.Cursor.execute, psycopg.Cursor.executemany

        def execute(cur, query, *a, **kw):
            if threading.current_thread().name == "bench-sampler":  # not the ledger's
                return plain(cur, query, *a, **kw)
            if threading.current_thread().name == "claimcheck-waker":
                meter.wakes += 1
                return plain(cur, query, *a, **kw)
            meter.statements += 1
            text = query if isinstance(query, str | bytes) else repr(query)
            if (
                "notify"
                in (text.decode(errors="replace") if isinstance(text, bytes) else text).lower()
            ):
                meter.notifying += 1
            return plain(cur, query, *a, **kw)

        def executemany(cur, *a, **kw):
            meter.statements += 1
            return many(cur, *a, **kw)

        self._patches = [
            mock.patch.object(psycopg.Cursor, "execute", execute),
            mock.patch.object(psycopg.Cursor, "executemany", executemany),
        ]
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self._patches:
            p.stop()


def db_stats(mon, name: str) -> dict[str, int]:
    mon.execute("SELECT pg_stat_clear_snapshot()")
    row = mon.execute(
        "SELECT xact_commit, xact_rollback, blks_hit, blks_read, tup_inserted, tup_updated, "
        "tup_deleted FROM pg_stat_database WHERE datname = %s",
        (name,),
    ).fetchone()
    keys = ("commits", "rollbacks", "blks_hit", "blks_read", "inserted", "updated", "deleted")
    return dict(zip(keys, row, strict=True))


CHANNELS = ("claimcheck_dispatch", "claimcheck_ticket")


def drain(listener, pid: int | None = None) -> tuple[int, int]:
    """Notifications delivered to ``listener`` since the last drain: all of
    them, and those sent by backend ``pid`` (the measured session, whose
    transactions are the ledger's writes). Wake-ups follow the commit from
    another session (core/wakes.py), so the second count is what took the
    cluster-wide notify lock inside a write transaction: 0 is the target."""
    got = list(listener.notifies(timeout=1.0))
    return len(got), sum(1 for n in got if n.pid == pid)


def measure(
    label: str, n: int, call, args_list: list, mon, listener, dboid: int, wal_dir: str
) -> dict:
    """Run ``call(arg)`` for each arg on a fresh Django connection; return
    the per-operation counts."""
    from django.db import connection

    connection.close()
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    # The pid query's own transaction flushes with the rest: count it out below.
    drain(listener)
    before = db_stats(mon, benchlib.DB_NAME)
    lsn0 = mon.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    cpu_db0 = backend_cpu_s(pid)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    with Meter() as meter:
        for arg in args_list:
            call(arg)
    cpu_worker = time.thread_time() - cpu0
    wall = time.perf_counter() - wall0
    cpu_db = backend_cpu_s(pid) - cpu_db0
    connection.close()  # the backend flushes its statistics as it exits
    benchlib.wait_for(
        lambda: not mon.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone(),
        timeout=30,
        what=f"backend {pid} to exit",
    )
    mon.execute("SELECT pg_stat_clear_snapshot()")
    lsn1 = mon.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    after = db_stats(mon, benchlib.DB_NAME)
    wal = wal_of_database(str(lsn0), str(lsn1), dboid, wal_dir)
    notifications, notified_inside = drain(listener, pid)
    delta = {k: after[k] - before[k] for k in after}
    delta["commits"] -= 1  # the pg_backend_pid() query's own transaction
    delta["commits"] -= meter.wakes  # counted apart: wake_commits
    per = {
        "statements": meter.statements / n,
        "commits": delta["commits"] / n,
        # Transactions that wrote: the commits that wait for a WAL flush.
        "write_commits": wal["commit_records"] / n,
        "notifying_statements": meter.notifying / n,
        "wake_commits": meter.wakes / n,
        "notifications": notifications / n,
        "notifications_in_write_transactions": notified_inside / n,
        "wal_bytes": wal["bytes"] / n,
        "wal_bytes_without_fpi": wal["bytes_without_fpi"] / n,
        "wal_records": wal["records"] / n,
        "wal_fpi": wal["fpi"] / n,
        "buffers": (delta["blks_hit"] + delta["blks_read"]) / n,
        "buffers_read": delta["blks_read"] / n,
        "rows_written": (delta["inserted"] + delta["updated"] + delta["deleted"]) / n,
        "db_cpu_ms": cpu_db * 1e3 / n,
        "worker_cpu_ms": cpu_worker * 1e3 / n,
        "wall_ms": wall * 1e3 / n,
    }
    out = {k: round(v, 3) for k, v in per.items()}
    out["by_node"] = wal["by_node"]
    return out


class BackendSampler(threading.Thread):
    """Every backend of the database, every 0.1 s: its application name and
    its CPU so far (``/proc/<pid>/stat``). A backend's CPU in the window is
    its last reading less its first (0 for one that started in the window);
    the last 0.1 s of one that exits is lost."""

    def __init__(self, dbname: str, skip: set[int]):
        super().__init__(daemon=True, name="bench-sampler")
        import psycopg

        self.conn = psycopg.connect(f"{benchlib.PG_SERVER}/postgres", autocommit=True)
        self.dbname, self.skip = dbname, skip
        self.names: dict[int, str] = {}
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop_flag = threading.Event()
        self.sample(initial=True)

    def sample(self, initial: bool = False) -> None:
        rows = self.conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s",
            (self.dbname,),
        ).fetchall()
        for pid, name in rows:
            if pid in self.skip:
                continue
            try:
                cpu = backend_cpu_s(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
            self.names[pid] = name
            self.first.setdefault(pid, cpu if initial else 0.0)
            self.last[pid] = cpu

    def run(self) -> None:
        while not self.stop_flag.wait(0.1):
            self.sample()

    def finish(self) -> float:
        self.stop_flag.set()
        self.join()
        self.sample()
        self.conn.close()
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


def worker_phase(
    conc: int, n: int, mon, dboid: int, wal_dir: str, log_dir: Path, skip: set[int]
) -> dict:
    """N pull tickets admitted here and run by a worker of ``conc``
    processes: every count of the window, per ticket."""
    import psycopg
    import redis
    from django.db import connection

    from bench import counted_celery
    from tickets.admission import admit_ticket
    from tickets.models import TERMINAL_STATES

    worker = benchlib.Proc(
        "bench-costs",
        [sys.executable, "-m", "bench.counted_celery", "-A", "config", "worker",
         "-Q", "turns,control", "-c", str(conc), "-P", "prefork", "-n", "bench-costs@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
        log_dir,
    )  # fmt: skip
    r = redis.Redis.from_url(benchlib.BROKER_URL)
    poller = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    listener = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    polls = 0
    tag = uuid.uuid4().hex[:8]

    def admit_all(prefix: str, count: int) -> list:
        return [
            admit_ticket(
                endpoint=f"{ADDRESS}-w{i % WORKER_ENDPOINTS:02d}",
                input={"key": f"{prefix}-{i}"},
                dedupe_key=f"{prefix}-{i}",
            ).ticket.id
            for i in range(count)
        ]

    def wait_done(ids: list) -> None:
        def done() -> bool:
            nonlocal polls
            polls += 1
            return poller.execute(
                "SELECT count(*) FROM tickets_ticket WHERE id = ANY(%s) AND state = ANY(%s)",
                (ids, list(TERMINAL_STATES)),
            ).fetchone()[0] == len(ids)

        benchlib.wait_for(done, timeout=300, interval=0.1, what=f"{len(ids)} tickets")

    def settled() -> dict[str, int]:
        """The worker's counts once they stop moving (its flush is 0.2 s)."""
        last = None
        for _ in range(25):
            time.sleep(3 * counted_celery.FLUSH_S)
            now = {k.decode(): int(v) for k, v in r.hgetall(counted_celery.KEY).items()}
            if now == last:
                return now
            last = now
        return last or {}

    try:
        for channel in CHANNELS:
            listener.execute(f"LISTEN {channel}")
        worker.wait_ready(timeout=120)
        wait_done(admit_all(f"{tag}-warm", 2 * WORKER_ENDPOINTS))
        settled()
        r.delete(counted_celery.KEY)
        drain(listener)
        connection.ensure_connection()
        polls = 0
        sampler = BackendSampler(
            benchlib.DB_NAME, {listener.info.backend_pid, poller.info.backend_pid, *skip}
        )
        before = db_stats(mon, benchlib.DB_NAME)
        lsn0 = mon.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        syncs0 = mon.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]
        sampler.start()
        wall0 = time.perf_counter()
        with Meter() as meter:
            ids = admit_all(tag, n)
        wait_done(ids)
        wall = time.perf_counter() - wall0
        counted = settled()
        db_cpu = sampler.finish()
        mon.execute("SELECT pg_stat_clear_snapshot()")
        lsn1 = mon.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
        after = db_stats(mon, benchlib.DB_NAME)
        # The cluster's WAL flushes (every session of the server's: an upper bound).
        syncs = mon.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0] - syncs0
        notes = list(listener.notifies(timeout=1.0))
        names = sampler.names
        states = dict(
            poller.execute(
                "SELECT state, count(*) FROM tickets_ticket WHERE id = ANY(%s) GROUP BY state",
                (ids,),
            ).fetchall()
        )
    finally:
        worker.stop()
        poller.close()
        listener.close()
        r.delete(counted_celery.KEY)
    if states != {"succeeded": n}:
        raise SystemExit(f"worker phase -c {conc}: {states}")
    wal = wal_of_database(str(lsn0), str(lsn1), dboid, wal_dir)
    delta = {k: after[k] - before[k] for k in after}
    wakes = meter.wakes + counted.get("wakes", 0)
    statements = meter.statements + counted.get("statements", 0)
    by_waker = sum(1 for x in notes if names.get(x.pid) == WAKER)
    unknown = sum(1 for x in notes if x.pid not in names)
    per = {
        "statements": statements / n,
        "statements_worker": counted.get("statements", 0) / n,
        "commits": (delta["commits"] - polls - wakes) / n,
        "write_commits": wal["commit_records"] / n,
        "wake_commits": wakes / n,
        "notifications": len(notes) / n,
        "notifications_in_write_transactions": (len(notes) - by_waker - unknown) / n,
        "notifications_unclassified": unknown / n,
        "wal_bytes": wal["bytes"] / n,
        "wal_bytes_without_fpi": wal["bytes_without_fpi"] / n,
        "buffers": (delta["blks_hit"] + delta["blks_read"]) / n,
        "rows_written": (delta["inserted"] + delta["updated"] + delta["deleted"]) / n,
        "db_cpu_ms": db_cpu * 1e3 / n,
        "wal_flushes_cluster": syncs / n,
        "tickets_per_s": n / wall,
    }
    out = {k: round(v, 3) for k, v in per.items()}
    out.update(workers=conc, n=n, load=round(os.getloadavg()[0], 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="operations of each kind")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--by-relation",
        action="store_true",
        help="also print each operation's WAL by table and index",
    )
    parser.add_argument(
        "--workers",
        default="2,4",
        help="worker processes of the pull-ticket phase (comma-separated; empty: none)",
    )
    args = parser.parse_args()
    worker_counts = [max(1, min(int(c), 8)) for c in args.workers.split(",") if c]
    n = max(50, min(args.n, 5000))
    benchlib.start_wall_clock()
    benchlib.use_database(DB)
    os.environ["DELIVERY_ALLOWED_HOSTS"] = "127.0.0.1"
    benchlib.recreate_database()
    benchlib.setup_django()

    import logging

    import psycopg
    from django.db import connection

    from config.celery import app
    from endpoints.services import create_endpoint
    from runtime.turns import run_ticket
    from tickets import delivery
    from tickets.admission import admit_ticket
    from tickets.models import Delivery, Ticket

    # Inline: the database's work is the same either way, and a forked child's
    # CPU would not show in this thread's time (bench/turns.py measures what
    # process isolation adds per turn).
    runner = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}
    ep = create_endpoint(address=ADDRESS, runner=runner)
    for i in range(WORKER_ENDPOINTS if worker_counts else 0):
        create_endpoint(address=f"{ADDRESS}-w{i:02d}", runner=runner)
    create_endpoint(address=HOME, runner=runner)
    create_endpoint(address=ROOTS, runner=runner)
    benchlib.seed_ledger(ep.id)
    receiver = Receiver()
    mon = psycopg.connect(f"{benchlib.PG_SERVER}/postgres", autocommit=True)
    listener = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    for channel in CHANNELS:
        listener.execute(f"LISTEN {channel}")
    published: list[str] = []
    results: dict[str, dict] = {}
    try:
        dboid = mon.execute(
            "SELECT oid FROM pg_database WHERE datname = %s", (benchlib.DB_NAME,)
        ).fetchone()[0]
        wal_dir = mon.execute("SHOW data_directory").fetchone()[0] + "/pg_wal"
        # A temporary slot (gone when this session ends) keeps the server from
        # recycling the WAL segments of a loop before pg_waldump reads them.
        mon.execute(
            "SELECT pg_create_physical_replication_slot(%s, true, true)",
            (f"bench_costs_{os.getpid()}",),
        )
        with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
            for (table,) in db.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall():
                db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            db.execute("VACUUM ANALYZE")
            names = relation_names(db)
        logging.disable(logging.INFO)

        def send_task(name, *a, **kw):
            published.append(name)

        def admit(key: str, **kw):
            return admit_ticket(endpoint=ADDRESS, input={"key": key}, dedupe_key=key, **kw)

        def turn(ticket_id):
            run_ticket(ticket_id=ticket_id, celery_task_id=str(uuid.uuid4()))

        def measured(label: str, call, items: list) -> None:
            # Warm the path (plans, caches) outside the count.
            warm, timed = items[:10], items[10:]
            for item in warm:
                call(item)
            start = len(published)
            results[label] = measure(label, len(timed), call, timed, mon, listener, dboid, wal_dir)
            results[label]["broker_messages"] = round((len(published) - start) / len(timed), 3)
            by_node = results[label].pop("by_node")
            print(f"  {label}: {json.dumps(results[label])}", flush=True)
            if args.by_relation:
                print_relations(label, by_node, names, len(timed))

        with mock.patch.object(app, "send_task", send_task):
            tag = uuid.uuid4().hex[:8]
            keys = [f"{tag}-{i}" for i in range(n + 10)]
            measured("admission", lambda k: admit(k), keys)
            plain = list(
                Ticket.objects.filter(dedupe_key__in=keys)
                .order_by("id")
                .values_list("id", flat=True)
            )
            measured("turn", turn, plain)
            # As a worker's pool process: registered, its slot recorded.
            from runtime import registry

            slotted_keys = [f"{tag}-slot-{i}" for i in range(n + 10)]
            slotted = [admit(k).ticket.id for k in slotted_keys]
            registry.register_worker(
                name="turns@bench-costs", host="bench", pid=os.getpid(), queues=["turns"],
                pool_size=1,
            )  # fmt: skip
            registry.set_node("turns@bench-costs")
            registry.slot_seen()
            try:
                measured("turn_in_a_slot", turn, slotted)
            finally:
                registry.set_node("")
            # A root each (a trace holds at most TRACE_HARD_LIMIT tickets), on an
            # endpoint of its own that never runs: the measured endpoint's
            # queue holds only the tickets the loop runs, in order.
            children = [
                admit(
                    f"{tag}-child-{i}",
                    parent_id=admit_ticket(
                        endpoint=ROOTS, input={"i": i}, dedupe_key=f"{tag}-root-{i}"
                    ).ticket.id,
                    return_to=HOME,
                ).ticket.id
                for i in range(n + 10)
            ]
            measured("turn_with_callback", turn, children)
            states = Ticket.objects.filter(id__in=children).values_list("state", flat=True)
            assert set(states) == {"succeeded"}, sorted(set(states))
            hooked = [
                admit(
                    f"{tag}-hook-{i}", requester={"name": "bench", "webhook_url": receiver.url}
                ).ticket.id
                for i in range(n + 10)
            ]
            measured("turn_with_webhook", turn, hooked)
            deliveries = list(
                Delivery.objects.filter(ticket_id__in=hooked, mode="webhook")
                .order_by("created_at")
                .values_list("id", flat=True)
            )
            states = Ticket.objects.filter(id__in=hooked).values_list("state", flat=True)
            assert set(states) == {"succeeded"}, sorted(set(states))
            assert len(deliveries) == len(hooked), (len(deliveries), len(hooked))
            measured("delivery", lambda d: delivery.send(delivery_id=d), deliveries)
            undelivered = Delivery.objects.filter(
                id__in=deliveries, delivered_at__isnull=True
            ).count()
            assert undelivered == 0, f"{undelivered} deliveries not delivered"
        log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-costs-"))
        for conc in worker_counts:
            got = worker_phase(conc, n, mon, dboid, wal_dir, log_dir, {listener.info.backend_pid})
            results[f"pull_ticket_c{conc}"] = got
            print(f"  pull ticket, {conc} worker processes: {json.dumps(got)}", flush=True)
        shutil.rmtree(log_dir, ignore_errors=True)
    finally:
        receiver.close()
        listener.close()
        mon.close()
        connection.close()
        if not args.keep:
            benchlib.drop_database()

    t, c = results["turn"], results["turn_with_callback"]
    results["callback"] = {k: round(c[k] - t[k], 3) for k in t}
    ticket = {
        k: round(
            results["admission"][k] + results["turn_with_webhook"][k] + results["delivery"][k],
            3,
        )
        for k in t
    }
    results["webhook_ticket"] = ticket
    results["pull_ticket"] = {k: round(results["admission"][k] + results["turn"][k], 3) for k in t}
    cols = ["statements", "commits", "write_commits", "notifications", "wal_bytes",
            "wal_bytes_without_fpi", "buffers", "rows_written", "db_cpu_ms", "worker_cpu_ms",
            "wall_ms", "broker_messages"]  # fmt: skip
    print(
        f"\nper operation, mean of {n} (a webhook ticket: admission + turn_with_webhook + delivery)"
    )
    print(f"  {'operation':<20}" + "".join(f"{c_[:12]:>13}" for c_ in cols))
    for label in [*OPERATIONS, "callback", "webhook_ticket", "pull_ticket",
                  *(f"pull_ticket_c{c}" for c in worker_counts)]:  # fmt: skip
        row = results[label]
        print(f"  {label:<20}" + "".join(f"{row.get(c_, 0):13.2f}" for c_ in cols))
    inside = max(
        results[label]["notifications_in_write_transactions"]
        for label in [*OPERATIONS, *(f"pull_ticket_c{c}" for c in worker_counts)]
    )
    print(f"  notifications sent inside a write transaction, most of any operation: {inside:.2f}")
    print(json.dumps({"bench": "costs", "n": n, "per_operation": results}, separators=(",", ":")))


if __name__ == "__main__":
    main()
