"""Retention at scale: ``prune_ledger`` removing a million finished tickets
in batches while admissions run.

Seeds ``claimcheck_bench_prune`` with N finished tickets (bench/scale.py's
set-based seed: the row, its events, turn, context entry, delivery, attempt
and trace, all created two days and more ago, so every one is past a one-day
cutoff), then admits new tickets at a steady pace (``--rate`` a second, one
thread, ``admit_ticket``) in three phases: quiet before, during the prune
(``tickets.retention.prune``, ``--batch`` traces per transaction, in another
thread), quiet after. Prints the admission latency p50/p99 of each phase,
the ratio of the prune's p99 to the quiet p99 (target within 2x), the
prune's rate and batch times, and every table's and index's size before the
prune, after it and after a plain VACUUM (what the space map can reuse; the
files shrink only under VACUUM FULL or when a partition is dropped).

Beside the prune, what the same retention would cost as a dropped
partition: the seeded tickets' rows copied into a table partitioned by
range of id (one partition, the ticket table's indexes), then that
partition detached (``DETACH PARTITION … CONCURRENTLY``) and dropped, timed,
with the cluster's WAL over each (``pg_current_wal_insert_lsn``: every
session of the server's, so an upper bound; the prune's includes the
admissions beside it). ``--no-partition-probe`` skips it.

``--tickets`` is capped at 2,000,000; ``--tickets 100000`` is the reduced
size ``make bench-all`` uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib, scale  # noqa: E402

DB = "claimcheck_bench_prune"
ADDRESS = "bench.prune-admit"
WALL_S = 4500
P99_TARGET = 2.0


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(q * len(s)))]


def relation_sizes(conn) -> dict[str, int]:
    """Every table of the pruned set and each of its indexes, in bytes."""
    rows = conn.execute(
        """
        SELECT c.relname, pg_table_size(c.oid) FROM pg_class c
         WHERE c.relname = ANY(%(t)s) AND c.relkind = 'r'
        UNION ALL
        SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
         WHERE c.relname = ANY(%(t)s)
        """,
        {"t": scale.TABLES},
    ).fetchall()
    return dict(rows)


class Admitter(threading.Thread):
    """Admits at a steady pace and records (phase, seconds) per admission."""

    def __init__(self, rate: float):
        super().__init__(daemon=True)
        self.interval = 1.0 / rate
        self.phase = "warm"
        self.samples: dict[str, list[float]] = {}
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        from tickets.admission import admit_ticket

        i = 0
        tag = uuid.uuid4().hex[:8]  # new keys on a reused ledger too
        next_at = time.perf_counter()
        try:
            while not self.stop_flag.is_set():
                key = f"prune-bench-{tag}-{i}"
                started = time.perf_counter()
                admitted = admit_ticket(endpoint=ADDRESS, input={"key": key}, dedupe_key=key)
                took = time.perf_counter() - started
                assert not admitted.duplicate
                self.samples.setdefault(self.phase, []).append(took)
                i += 1
                next_at += self.interval
                delay = next_at - time.perf_counter()
                if delay > 0:
                    self.stop_flag.wait(delay)
                else:
                    next_at = time.perf_counter()  # behind: do not burst to catch up
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            connection.close()


def lsn(db) -> int:
    # pg_lsn - pg_lsn is numeric (a Decimal here), which json cannot write.
    return int(db.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])


def partition_probe(db) -> dict:
    """The seeded tickets as one partition of a table partitioned by range of
    id, with the ticket table's own indexes, detached and dropped: seconds
    and WAL bytes, against the rows it held."""
    indexes = [
        d for (d,) in db.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid = 'tickets_ticket'::regclass"
        ).fetchall()
    ]  # fmt: skip
    db.execute("DROP TABLE IF EXISTS bench_part_probe")
    db.execute("CREATE TABLE bench_part_probe (LIKE tickets_ticket) PARTITION BY RANGE (id)")
    db.execute(
        "CREATE TABLE bench_part_probe_old PARTITION OF bench_part_probe "
        "FOR VALUES FROM (MINVALUE) TO (MAXVALUE)"
    )
    rows = db.execute("INSERT INTO bench_part_probe SELECT * FROM tickets_ticket").rowcount
    made = 0
    for i, ddl in enumerate(indexes):
        # A unique index of a partitioned table must hold the partition key.
        if " UNIQUE " in ddl and "(id)" not in ddl:
            ddl = ddl.replace(" UNIQUE ", " ")
        on = ddl.split(" USING ", 1)[1]
        db.execute(f"CREATE INDEX bench_part_probe_{i} ON bench_part_probe USING {on}")
        made += 1
    db.execute("VACUUM ANALYZE bench_part_probe")
    size = db.execute("SELECT pg_total_relation_size('bench_part_probe_old')").fetchone()[0]
    wal0, t0 = lsn(db), time.perf_counter()
    db.execute("ALTER TABLE bench_part_probe DETACH PARTITION bench_part_probe_old CONCURRENTLY")
    db.execute("DROP TABLE bench_part_probe_old")
    seconds, wal = time.perf_counter() - t0, lsn(db) - wal0
    db.execute("DROP TABLE bench_part_probe")
    return {"rows": rows, "indexes": made, "bytes": size, "seconds": round(seconds, 4),
            "wal_bytes": wal}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=500, help="traces per prune transaction")
    parser.add_argument(
        "--pause-ratio",
        type=float,
        default=None,
        help="prune_ledger's --pause-ratio (default: RETENTION_PAUSE_RATIO)",
    )
    parser.add_argument("--rate", type=float, default=50.0, help="admissions a second")
    parser.add_argument("--quiet-s", type=float, default=30.0, help="each quiet phase")
    parser.add_argument(
        "--max-prune-s",
        type=float,
        default=3600.0,
        help="stop the prune after this long (its batches so far are reported)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="use the database a --keep run left (no seeding)"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-partition-probe", action="store_true")
    args = parser.parse_args()
    max_prune_s = max(10.0, min(args.max_prune_s, 4000.0))
    tickets = max(10_000, min(args.tickets, 2_000_000))
    rate = max(1.0, min(args.rate, 500.0))
    quiet_s = max(5.0, min(args.quiet_s, 300.0))
    benchlib.start_wall_clock(WALL_S)
    benchlib.use_database(DB)
    if not args.reuse:
        benchlib.recreate_database()
    benchlib.setup_django()
    from django.conf import settings

    pause_ratio = settings.RETENTION_PAUSE_RATIO if args.pause_ratio is None else args.pause_ratio

    from datetime import UTC, datetime, timedelta

    import psycopg
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.keys import create_api_key
    from endpoints.services import create_endpoint
    from tickets import retention

    runner = {"kind": "python", "path": "runtime.demo.echo"}
    if not args.reuse:
        endpoints = [
            create_endpoint(address=f"bench.scale-{i:02d}", runner=runner).id
            for i in range(scale.ENDPOINTS)
        ]
        create_endpoint(address=ADDRESS, runner=runner)
        create_api_key(username="bench-staff", staff=True)
        users = list(get_user_model().objects.order_by("id").values_list("id", flat=True))
    connection.close()

    db = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    summary: dict = {
        "bench": "prune",
        "tickets": tickets,
        "batch": args.batch,
        "pause_ratio": pause_ratio,
        "rate": rate,
    }
    admitter = None
    try:
        seed_s = 0.0
        if args.reuse:
            tickets = db.execute("SELECT count(*) FROM tickets_ticket").fetchone()[0]
            summary["tickets"] = tickets
            print(f"reusing {tickets:,} tickets", flush=True)
        else:
            db.execute(scale.UUID7)
            db.execute(scale.TEXT)
            # The newest seeded ticket two days old: all past a one-day cutoff.
            t0 = (datetime.now(UTC) - timedelta(days=2)).isoformat()
            ctx = {"t0": t0, "step": scale.STEP_S, "queued": 0, "endpoints": endpoints,
                   "users": users, "seq_base": tickets + 1}  # fmt: skip
            seed_s = scale.seed(
                db, first=1, last=tickets, ctx=ctx, progress=lambda t: print(t, flush=True)
            )
            print(f"seeded {tickets:,} tickets in {seed_s:.0f} s", flush=True)
        scale.vacuum_analyze(db)
        before = relation_sizes(db)
        candidates = db.execute(
            "SELECT tickets FROM claimcheck_prune_ledger(now() - interval '1 day', "
            "2147483647, true, %s)",
            (20,),
        ).fetchone()[0]
        print(f"prune candidates: {candidates:,} tickets", flush=True)
        probe = None if args.no_partition_probe else partition_probe(db)
        if probe:
            print(f"partition probe: {probe}", flush=True)

        admitter = Admitter(rate)
        admitter.start()
        time.sleep(3)  # warm-up samples, discarded: the pace, not a signal
        admitter.phase = "quiet_before"
        admitter.stop_flag.wait(quiet_s)
        admitter.phase = "prune"
        result: dict = {}

        def run_prune() -> None:
            # What prune_ledger runs: tickets.retention.prune, timed whole.
            try:
                started = time.perf_counter()
                result["report"] = retention.prune(
                    older_than_days=1,
                    batch=args.batch,
                    pause_ratio=pause_ratio,
                    max_s=max_prune_s,
                )
                result["s"] = time.perf_counter() - started
            except BaseException as exc:
                result["error"] = exc
            finally:
                connection.close()

        pruner = threading.Thread(target=run_prune, daemon=True)
        wal0 = lsn(db)
        pruner.start()
        pruner.join()
        prune_wal = lsn(db) - wal0
        admitter.phase = "quiet_after"
        admitter.stop_flag.wait(quiet_s)
        admitter.stop_flag.set()
        admitter.join(30)
        if admitter.error:
            raise admitter.error
        if "error" in result:
            raise result["error"]
        report = result["report"]
        after = relation_sizes(db)
        db.execute("VACUUM ANALYZE")
        vacuumed = relation_sizes(db)
        left = db.execute("SELECT count(*) FROM tickets_ticket").fetchone()[0]
    finally:
        if admitter is not None:
            admitter.stop_flag.set()
        db.close()
        connection.close()
        if not args.keep:
            benchlib.drop_database()

    s = admitter.samples
    quiet = s.get("quiet_before", []) + s.get("quiet_after", [])
    phases = {
        name: {
            "count": len(v),
            "p50_ms": round(pct(v, 0.5) * 1e3, 2),
            "p99_ms": round(pct(v, 0.99) * 1e3, 2),
            "max_ms": round(max(v) * 1e3, 2),
        }
        for name, v in (
            ("quiet", quiet),
            ("prune", s.get("prune", [])),
            ("quiet_before", s.get("quiet_before", [])),
            ("quiet_after", s.get("quiet_after", [])),
        )  # fmt: skip
        if v
    }
    ratio = round(phases["prune"]["p99_ms"] / phases["quiet"]["p99_ms"], 3)
    pruned = report.counts["tickets"]
    batch_s = report.batch_s
    print(
        f"\nprune_ledger --batch {args.batch}: {pruned:,} tickets ({report.counts['traces']:,} "
        f"traces, {report.counts['events']:,} events) in {result['s']:.0f} s, "
        f"{report.batches} batches, {pruned / result['s']:.0f} tickets/s; {left:,} left; "
        f"paused {report.paused_s:.1f} s (--pause-ratio {pause_ratio:g})"
    )
    if batch_s:
        first = batch_s[: max(1, len(batch_s) // 10)]
        last = batch_s[-max(1, len(batch_s) // 10) :]
        print(
            f"batch seconds: median {pct(batch_s, 0.5):.2f}, p90 {pct(batch_s, 0.9):.2f}, "
            f"first tenth mean {sum(first) / len(first):.2f}, last tenth mean "
            f"{sum(last) / len(last):.2f}"
            + ("" if report.complete else f"; stopped by --max-prune-s {max_prune_s:g} s")
        )
    print(f"cluster WAL while pruning: {prune_wal / max(1, pruned):.0f} bytes per pruned ticket "
          f"(admissions beside it and other sessions included)")  # fmt: skip
    if probe:
        print(
            f"the same as a dropped partition: {probe['rows']:,} ticket rows "
            f"({probe['bytes'] / 2**20:.1f} MB with {probe['indexes']} indexes) detached and "
            f"dropped in {probe['seconds'] * 1e3:.0f} ms, {probe['wal_bytes']:,} bytes of WAL"
        )
    print(f"admissions at {rate:g}/s (ms):")
    for name, f in phases.items():
        print(
            f"  {name:<13} n={f['count']:<6} p50 {f['p50_ms']:7.2f}  p99 {f['p99_ms']:7.2f}  "
            f"max {f['max_ms']:8.2f}"
        )
    flag = "met" if ratio <= P99_TARGET else "MISSED"
    print(f"  p99 during the prune / quiet p99: {ratio:.2f} (target <= {P99_TARGET:g}: {flag})")
    print("\nsizes, MB: before / after the prune / after VACUUM")
    for name in sorted(before, key=lambda n: -before[n]):
        b, a, v = before[name], after.get(name, 0), vacuumed.get(name, 0)
        if b < 1 << 20:
            continue
        print(f"  {name:<58} {b / 2**20:9.1f} {a / 2**20:9.1f} {v / 2**20:9.1f}")
    summary.update(
        seed_s=round(seed_s, 1),
        candidates=candidates,
        pruned=report.counts,
        batches=report.batches,
        prune_s=round(result["s"], 1),
        paused_s=round(report.paused_s, 1),
        tickets_per_s=round(pruned / result["s"], 1),
        batch_s={
            "median": round(pct(batch_s, 0.5), 3),
            "p90": round(pct(batch_s, 0.9), 3),
            "all": [round(x, 3) for x in batch_s],
        },  # fmt: skip
        complete=report.complete,
        left=left,
        wal_bytes_per_pruned_ticket=round(prune_wal / max(1, pruned)),
        partition_probe=probe,
        admission=phases,
        ratio={"prune_p99_vs_quiet_p99": ratio},
        sizes={"before": before, "after": after, "after_vacuum": vacuumed},
    )
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
