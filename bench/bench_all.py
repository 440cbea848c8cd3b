"""Every benchmark at reduced size, one table of every ratio against its
target, written as JSON under bench/results/ (``make bench-all``).

Runs each script in a subprocess, one at a time (they share the broker db),
takes its one-line JSON summary (the last line of its output that parses as
a JSON object), and derives the ratios below from it. The result file holds
the commit, the machine (cores, CPU model, load average at the start and the
end), the date, every ratio with its target and whether it met it, and every
script's whole summary. ``bench/compare.py`` compares two such files.

``--only admission,turns`` runs a subset; ``--sizes full`` runs the scripts
at their own defaults instead of the reduced sizes (hours, not minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

RESULTS = benchlib.ROOT / "bench" / "results"


@dataclass(frozen=True)
class Ratio:
    """One figure of the table: ``get`` reads it from a script's summary;
    ``op`` and ``target`` state the goal (">=": higher is better, "<=":
    lower is better, "==": a count that must equal the target)."""

    name: str
    script: str
    get: object
    op: str
    target: float
    note: str = ""


def _best_peer(s: dict) -> float:
    a = s["admission_per_s"]
    return a["claimcheck"] / max(a["dbos"], a["procrastinate"])


def _worst_rep(s: dict, peer: str) -> float:
    runs = s["e2e_per_s_runs"]
    return min(c / p for c, p in zip(runs["claimcheck"], runs[peer], strict=True))


def _http_p99(s: dict) -> float:
    return s["tickets_c8"]["p99_ms"] / s["floor_c8"]["p99_ms"]


def _worst_growth(s: dict) -> float:
    return max(f["growth"] for f in s["figures"].values())


RATIOS = [
    Ratio("admission.vs_best_peer", "peers", _best_peer, ">=", 2.0,
          "new key, against the faster of DBOS and Procrastinate"),
    Ratio("admission.vs_dbos", "peers", lambda s: s["admission_ratio"]["claimcheck_vs_dbos"],
          ">=", 2.0),
    Ratio("admission.vs_procrastinate", "peers",
          lambda s: s["admission_ratio"]["claimcheck_vs_procrastinate"], ">=", 2.0),
    Ratio("admission.vs_statement", "admission", lambda s: s["ratio"]["new_vs_raw_cte"],
          ">=", 0.85, "admit_ticket against its raw statement"),
    Ratio("admission.statement_vs_insert", "admission",
          lambda s: s["per_s"]["raw_cte"] / s["per_s"]["raw_insert"], ">=", 1 / 1.5,
          "the statement within 1.5x of a one-row insert"),
    Ratio("admission.duplicate_vs_floor", "admission",
          lambda s: s["ratio"]["duplicate_vs_raw_dup"], ">=", 0.6),
    Ratio("e2e.vs_procrastinate", "peers", lambda s: s["e2e_ratio"]["claimcheck_vs_procrastinate"],
          ">=", 1.5),
    Ratio("e2e.vs_procrastinate_worst_rep", "peers", lambda s: _worst_rep(s, "procrastinate"),
          ">=", 1.5, "every repetition"),
    Ratio("e2e.vs_celery", "peers", lambda s: s["e2e_ratio"]["claimcheck_vs_celery"], ">=", 0.6),
    Ratio("e2e.vs_celery_worst_rep", "peers", lambda s: _worst_rep(s, "celery"), ">=", 0.6,
          "every repetition"),
    Ratio("turns.pipeline_vs_celery", "turns", lambda s: s["ratio"], ">=", 0.35),
    Ratio("turns.isolated_vs_inline", "turns", lambda s: s["isolated"]["ratio_to_inline"],
          ">=", 0.8),
    Ratio("turns.cpu_ms_per_ticket", "turns", lambda s: s["cpu_ms_per_ticket"]["total"],
          "<=", 5.0, "CPU of every part, admission to finish: steadier than a rate"),
    Ratio("turns.postgres_cpu_ms_per_ticket", "turns",
          lambda s: s["cpu_ms_per_ticket"]["postgres"], "<=", 2.5,
          "PostgreSQL's share (749bf1f: 2.4-2.6)"),
    Ratio("http.c8_vs_floor", "http", lambda s: s["tickets_c8"]["ratio_to_floor"], ">=", 0.8),
    Ratio("http.c8_p99_vs_floor_p99", "http", _http_p99, "<=", 1.5),
    Ratio("http.c32_errors", "http", lambda s: s["tickets_c32"]["errors"], "==", 0),
    Ratio("http.c32_vs_floor", "http", lambda s: s["tickets_c32"]["ratio_to_floor"], ">=", 0.8),
    Ratio("scale.worst_growth_1M_vs_10k", "scale", _worst_growth, "<=", 1.5,
          "reduced run: the large ledger is --large tickets"),
    Ratio("prune.p99_vs_quiet", "prune", lambda s: s["ratio"]["prune_p99_vs_quiet_p99"],
          "<=", 2.0),
    Ratio("concurrency.admit_c1_vs_procrastinate", "concurrency",
          lambda s: s["ratio"]["1"]["admit_vs_procrastinate"], ">=", 1.0,
          "pgbench at the database, one client"),
    Ratio("concurrency.admit_c32_vs_procrastinate", "concurrency",
          lambda s: s["ratio"]["32"]["admit_vs_procrastinate"], ">=", 1.5),
    Ratio("concurrency.admit_32_vs_8", "concurrency", lambda s: s["admit_32_vs_8"], ">=", 1.0,
          "no negative scaling"),
    Ratio("concurrency.admit_c32_vs_insert", "concurrency",
          lambda s: s["ratio"]["32"]["admit_vs_insert"], ">=", 0.25),
    Ratio("concurrency.http_c32_vs_floor", "concurrency",
          lambda s: s["http"]["c32"]["ratio_to_floor"], ">=", 0.8,
          "POST /api/v1/tickets against the ninja one-row floor, 32 connections"),
    Ratio("concurrency.http_c32_errors", "concurrency",
          lambda s: s["http"]["c32"]["tickets"]["errors"], "==", 0),
    Ratio("concurrency.e2e_c2_vs_procrastinate_worst_rep", "concurrency",
          lambda s: s["e2e"]["c2"]["worst_rep"]["claimcheck_vs_procrastinate"], ">=", 1.5,
          "2 worker processes, every repetition"),
    Ratio("concurrency.e2e_c2_vs_celery_worst_rep", "concurrency",
          lambda s: s["e2e"]["c2"]["worst_rep"]["claimcheck_vs_celery"], ">=", 0.6,
          "2 worker processes, every repetition"),
    Ratio("costs.notifications_in_write_transactions", "costs",
          lambda s: max(v.get("notifications_in_write_transactions", 1)
                        for v in s["per_operation"].values()), "==", 0,
          "no NOTIFY inside a write transaction (core/wakes.py)"),
    Ratio("costs.admission_statements", "costs",
          lambda s: s["per_operation"]["admission"]["statements"], "<=", 1.0),
    Ratio("costs.turn_commits", "costs", lambda s: s["per_operation"]["turn"]["commits"],
          "<=", 3.0, "counted, load-independent"),
    Ratio("costs.webhook_ticket_wal_bytes", "costs",
          lambda s: s["per_operation"]["webhook_ticket"]["wal_bytes_without_fpi"], "<=", 16384,
          "WAL bytes per ticket, full-page images left out"),
]  # fmt: skip

# The reduced sizes (≤ 15 minutes on a quiet 2-core machine), and the full ones.
SCRIPTS = {
    "admission": ["bench/admission.py", "-n", "500", "--reps", "3"],
    "turns": ["bench/turns.py", "-n", "200", "--reps", "2", "--latency-probes", "10",
               "--backlog", "1000"],
    "peers": ["bench/peers.py", "-n", "500", "-e", "300", "--reps", "2"],
    "http": ["bench/http.py", "-d", "5", "--reps", "2"],
    "scale": ["bench/scale.py", "--small", "10000", "--large", "100000", "-r", "5",
               "--large-results", "500"],
    "prune": ["bench/prune.py", "--tickets", "100000", "--quiet-s", "15"],
    "costs": ["bench/costs.py", "-n", "200", "--workers", "2"],
    "concurrency": ["bench/concurrency.py", "-T", "5", "--reps", "1", "--clients", "1,8,32,64",
                    "--quick"],
}  # fmt: skip


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "model": model, "host": platform.node(),
            "python": platform.python_version()}  # fmt: skip


def commit() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=benchlib.ROOT, capture_output=True,
                              text=True, check=False).stdout.strip()  # fmt: skip

    return {"sha": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}  # fmt: skip


def last_json(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def met(op: str, value: float, target: float) -> bool:
    if op == ">=":
        return value >= target
    if op == "<=":
        return value <= target
    return value == target


def evaluate(summaries: dict[str, dict]) -> list[dict]:
    rows = []
    for r in RATIOS:
        s = summaries.get(r.script)
        if s is None:
            continue
        try:
            value = float(r.get(s))
        except (KeyError, TypeError, ZeroDivisionError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            rows.append({"name": r.name, "script": r.script, "error": error})
            continue
        rows.append({"name": r.name, "script": r.script, "value": round(value, 4), "op": r.op,
                     "target": round(r.target, 4), "met": met(r.op, value, r.target),
                     "note": r.note})  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'ratio':<36} {'value':>10}  target    met", "-" * 64]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['name']:<36} {'—':>10}  {row['error']}")
            continue
        lines.append(
            f"{row['name']:<36} {row['value']:>10.3f}  {row['op']} {row['target']:<7g} "
            f"{'yes' if row['met'] else 'NO'}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated scripts: " + ",".join(SCRIPTS))
    parser.add_argument("--sizes", choices=["reduced", "full"], default="reduced")
    parser.add_argument("--out", default="", help="the JSON file (default: bench/results/…)")
    parser.add_argument("--timeout", type=float, default=1800, help="per script, seconds")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SCRIPTS)
    unknown = sorted(set(names) - set(SCRIPTS))
    if unknown:
        parser.error(f"unknown scripts {unknown}; known: {', '.join(SCRIPTS)}")
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    # The commit under test is the one checked out when the run starts.
    tested = commit()
    summaries: dict[str, dict] = {}
    runs: dict[str, dict] = {}
    for name in names:
        argv = SCRIPTS[name]
        if args.sizes == "full":
            argv = argv[:1]
        print(f"== {name}: {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, *argv], cwd=benchlib.ROOT, capture_output=True,
                                  text=True, timeout=args.timeout, check=False)  # fmt: skip
            out, rc = done.stdout, done.returncode
            err = done.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or b""
            out = out.decode(errors="replace") if isinstance(out, bytes) else out
            rc, err = -1, f"timed out after {args.timeout:g} s"
        seconds = time.perf_counter() - t0
        summary = last_json(out) if rc == 0 else None
        runs[name] = {"argv": argv, "seconds": round(seconds, 1), "returncode": rc}
        if summary is None:
            runs[name]["error"] = (err or out)[-2000:]
            print(f"   FAILED (rc {rc}) after {seconds:.0f} s:\n{(err or out)[-1500:]}", flush=True)
            continue
        summaries[name] = summary
        print(f"   {seconds:.0f} s", flush=True)
    rows = evaluate(summaries)
    result = {
        "date": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": tested,
        "machine": {
            **machine(),
            "load_start": [round(x, 2) for x in load_start],
            "load_end": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "sizes": args.sizes,
        "runs": runs,
        "ratios": rows,
        "summaries": summaries,
    }
    out_path = (
        Path(args.out)
        if args.out
        else RESULTS / (f"{started.strftime('%Y%m%dT%H%M%SZ')}-{result['commit']['sha'][:10]}.json")
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print()
    print(table(rows))
    m = result["machine"]
    print(f"\n{m['cores']} cores, {m['model']}; load {m['load_start']} -> {m['load_end']}")
    print(f"written: {out_path}")
    if any(r.get("error") for r in runs.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
