"""What each row and index of an admission costs at concurrency: the
installed ``claimcheck_admit`` against variants of it that leave one part
out, under pgbench at 1 to 32 clients, in one run on one database (the
decisions of docs/explanation/scale.md, "What an admission writes").

    .venv/bin/python bench/admission_variants.py [-T 8] [--reps 2] [--clients 1,8,32]
        [--from-git REV]

The variants are made from ``claimcheck_admit`` as a tree installed it
(``--from-git``: the old admission's file, ``claimcheck_admit.sql`` under ``tickets/sql/``, of that
revision, installed in the scratch database first: the one-function shape
before claimcheck_admit_v2, e.g. ``--from-git 2a9189c``), each differing
from it by one thing:

- ``admit``: the function as that tree shipped it;
- ``no_event``: without the admission's event row;
- ``no_trace``: without the trace row for a root that opens its own trace
  (the common case: no trace given, no parent);
- ``no_event_trace``: without both;
- ``admit_v2``: this tree's ``claimcheck_admit_v2``, as the application calls it
  (the admission event implied by the ticket row);
- ``admit_v2_row``: the same with the admission event as a row, as it
  writes it while the previous release's ``claimcheck_admit`` is installed
  (the old function is renamed ``bench_admit`` here, so ``admit_v2`` sees
  none).

Then the ticket's text-search GIN indexes (input, result, the scoped
document), where the schema still has them, are dropped and ``admit`` and
``no_event_trace`` run again (``*_nogin``). ``insert`` (a one-row insert)
and ``procrastinate`` (its defer) are the floor and the peer of the same
run. The variants are a measurement, not a second implementation: the
function they are made from is the one the application calls. A variant
whose part the installed function no longer writes is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib, concurrency  # noqa: E402

# The previous admission's file, read from an older revision with `git show`.
OLD_ADMIT_FILE = "/".join(("tickets", "sql", "claimcheck_admit.sql"))

GIN = ("ticket_input_search_idx", "ticket_result_search_idx", "ticket_search_scoped_idx")

_EVENT = re.compile(
    r"WITH ev AS \(\s*(INSERT INTO tickets_ticketevent .*?p_now\))\s*\)\s*", re.DOTALL
)
_TRACE = re.compile(
    r"(INSERT INTO tickets_trace AS tr .*?INTO v_count, v_party_count, v_flagged;)", re.DOTALL
)


def _variants(source: str) -> dict[str, str]:
    """The installed function's source, renamed, with a part left out."""
    out: dict[str, str] = {}
    event = _EVENT.search(source)
    trace = _TRACE.search(source)
    if event and trace:
        standalone = _EVENT.sub(lambda m: m.group(1) + ";\n                ", source, count=1)
        root_skip = (
            "IF p_trace IS NULL AND p_parent IS NULL THEN\n"
            "    v_count := 1; v_party_count := 1; v_flagged := false;\n"
            "ELSE\n\\1\nEND IF;"
        )
        out["no_event"] = _EVENT.sub("", source, count=1)
        out["no_trace"] = _TRACE.sub(root_skip, standalone, count=1)
        out["no_event_trace"] = _TRACE.sub(root_skip, _EVENT.sub("", source, count=1), count=1)
    return {
        name: text.replace("public.claimcheck_admit(", f"public.bench_{name}(", 1)
        for name, text in out.items()
    }


def _counts(names: list[str], n: int, block: int, suffix: str) -> dict[str, dict[str, float]]:
    """Per call of each script's statement on one connection each, in
    blocks of ``block`` calls with the order rotating: the WAL the call
    writes (``EXPLAIN (ANALYZE, WAL)``: the backend's own records, the
    function's statements included, not the commit record; the median, so
    a full-page image after a checkpoint does not count) and the backend's
    CPU. Counts, not rates: a loaded machine moves the CPU a little and the
    WAL not at all."""
    import psycopg

    from bench.costs import backend_cpu_s

    sql = {
        name: "EXPLAIN (ANALYZE, WAL, FORMAT JSON) SELECT "
        + concurrency.SCRIPTS[name]
        .split("SELECT ", 1)[1]
        .rstrip(";")
        .replace("{id}", concurrency._ID)
        .replace("{key}", "md5(random()::text)")
        .replace(":r", "(random() * 1e9)::int")
        .replace("{{", "{")
        .replace("}}", "}")
        for name in names
    }
    conns = {name: psycopg.connect(benchlib.DATABASE_URL, autocommit=True) for name in names}
    pids = {n: c.execute("SELECT pg_backend_pid()").fetchone()[0] for n, c in conns.items()}
    wal: dict[str, list[int]] = {name: [] for name in names}
    records: dict[str, list[int]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    for name, c in conns.items():  # plans made, caches warm
        for _ in range(20):
            c.execute(sql[name])
    order: list[str] = []
    for b in range(max(1, n // block)):
        k = b % len(names)
        order += names[k:] + names[:k]
    for name in order:
        c = conns[name]
        cpu0 = backend_cpu_s(pids[name])
        for _ in range(block):
            plan = c.execute(sql[name]).fetchone()[0][0]["Plan"]
            wal[name].append(int(plan["WAL Bytes"]))
            records[name].append(int(plan["WAL Records"]))
        cpu[name] += backend_cpu_s(pids[name]) - cpu0
    for c in conns.values():
        c.close()
    per = {}
    for name in names:
        calls = len(wal[name])
        row = per[name + suffix] = {
            "wal_bytes": benchlib.median(wal[name]),
            "wal_records": benchlib.median(records[name]),
            "db_cpu_ms": round(1000 * cpu[name] / calls, 3),
        }
        print(f"  {name + suffix:<20} WAL {row['wal_bytes']:6.0f} B/call "
              f"({row['wal_records']:.0f} records, median), backend CPU "
              f"{row['db_cpu_ms']:.3f} ms/call (with EXPLAIN's own)", flush=True)  # fmt: skip
    return per


def main() -> None:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-T", type=int, default=8, help="seconds a point")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seed", type=int, default=20_000, help="finished tickets first")
    parser.add_argument("--from-git", metavar="REV", help="claimcheck_admit of this revision")
    parser.add_argument(
        "--counts", type=int, default=0, metavar="N",
        help="instead of pgbench: WAL bytes and backend CPU per call over N calls each",
    )  # fmt: skip
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    benchlib.start_wall_clock(limit_s=max(900, 60 + args.reps * len(clients) * 10 * (args.T + 2)))
    concurrency.DB = "claimcheck_bench_variants"
    concurrency.setup(args.seed)
    with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
        if args.from_git:
            db.execute(
                subprocess.run(
                    ["git", "show", f"{args.from_git}:" + OLD_ADMIT_FILE],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout  # fmt: skip
            )
        source = db.execute("SELECT pg_get_functiondef('claimcheck_admit'::regproc)").fetchone()[0]
        made = _variants(source)
        for text in made.values():
            db.execute(text)
        # claimcheck_admit_v2 writes its admission event as a row while a
        # claimcheck_admit is installed: the old one runs under another name.
        db.execute("ALTER FUNCTION claimcheck_admit RENAME TO bench_admit")
        v2 = db.execute("SELECT pg_get_functiondef('claimcheck_admit_v2'::regproc)").fetchone()[0]
        gate = "to_regproc('claimcheck_admit') IS NULL"
        if gate in v2:
            db.execute(
                v2.replace(gate, "false").replace(
                    "public.claimcheck_admit_v2(", "public.bench_admit_v2_row(", 1
                )
            )
        gin = [
            name
            for (name,) in db.execute(
                "SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s)", [list(GIN)]
            )
        ]
    admit = concurrency.SCRIPTS["admit"].replace("claimcheck_admit_v2(", "bench_admit(")
    scripts = {"insert": concurrency.SCRIPTS["insert"], "admit": admit}
    for name in made:
        scripts[name] = admit.replace("bench_admit(", f"bench_{name}(")
    # This tree's claimcheck_admit_v2, beside them in the same run.
    scripts["admit_v2"] = concurrency.SCRIPTS["admit"]
    if gate in v2:
        scripts["admit_v2_row"] = admit.replace("bench_admit(", "bench_admit_v2_row(")
    scripts["procrastinate"] = concurrency.SCRIPTS["procrastinate"]
    concurrency.SCRIPTS.update(scripts)
    phases = [list(scripts)]
    if gin:
        phases.append(
            ["admit", *(["no_event_trace"] if "no_event_trace" in made else []), "admit_v2",
             *(["admit_v2_row"] if "admit_v2_row" in scripts else [])]
        )  # fmt: skip
    if args.counts:
        counted: dict[str, dict[str, float]] = {}
        try:
            for phase, names in enumerate(phases):
                if phase == 1:
                    with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
                        for name in gin:
                            db.execute(f"DROP INDEX {name}")
                names = [n for n in names if n not in ("insert", "procrastinate")]
                counted.update(_counts(names, args.counts, 50, "_nogin" if phase else ""))
        finally:
            benchlib.drop_database_named(benchlib.DB_NAME)
            benchlib.drop_database_named(concurrency.PC_DB + benchlib.SUFFIX)
        print(json.dumps({"bench": "admission_variants", "counts": counted}))
        return
    runs: dict[str, dict[int, list[float]]] = {}
    load0 = os.getloadavg()[0]
    try:
        for phase, names in enumerate(phases):
            if phase == 1:
                with psycopg.connect(benchlib.DATABASE_URL, autocommit=True) as db:
                    for name in gin:
                        db.execute(f"DROP INDEX {name}")
            suffix = "_nogin" if phase == 1 else ""
            for rep in range(args.reps):
                for c in clients:
                    for name in names:
                        tps = concurrency.pgbench(name, c, args.T)
                        runs.setdefault(name + suffix, {k: [] for k in clients})[c].append(tps)
                        print(f"  rep {rep + 1} c{c:<3} {name + suffix:<20} {tps:10.0f} tx/s",
                              flush=True)  # fmt: skip
    finally:
        benchlib.drop_database_named(benchlib.DB_NAME)
        benchlib.drop_database_named(concurrency.PC_DB + benchlib.SUFFIX)
    med = {n: {c: benchlib.median(v) for c, v in by.items()} for n, by in runs.items()}
    print(f"\nmedian tx/s of {args.reps} ({args.T} s a point); load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; GIN indexes dropped in phase 2: {gin}")  # fmt: skip
    print(f"  {'clients':<20}" + "".join(f"{c:>10}" for c in clients) + "   vs admit")
    for name, by in med.items():
        vs = " ".join(f"{by[c] / med['admit'][c]:.2f}" for c in clients)
        print(f"  {name:<20}" + "".join(f"{by[c]:10.0f}" for c in clients) + f"   {vs}")
    print(json.dumps({"bench": "admission_variants", "seconds": args.T, "reps": args.reps,
                      "per_s": {n: {str(c): round(v) for c, v in by.items()}
                                for n, by in med.items()}},
                     separators=(",", ":")))  # fmt: skip


if __name__ == "__main__":
    main()
