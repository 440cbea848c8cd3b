"""Compare two ``make bench-all`` result files and flag every ratio that fell
by more than its noise (``make bench-compare A=… B=…``).

    .venv/bin/python bench/compare.py A.json B.json [--noise bench/noise.json]
    .venv/bin/python bench/compare.py --measure-noise R1.json R2.json [R3.json …]

A ratio "falls" in the direction its target names: a ">=" ratio falls when
it goes down, a "<=" ratio (a p99 ratio, a count of statements or WAL bytes)
when it goes up, an "==" figure (errors) when it leaves its target. The fall
is relative to A: (A − B) / A for ">=", (B − A) / A for "<=". A fall larger
than the ratio's band in the noise file is a regression; the exit status is
1 when there is one.

Both files must come from one kind of machine (the CPU model and the core
count ``bench_all.py`` records): the same code ran 2-3 times slower on one
2-core kind than on another here, and its ratios moved too (admission
against its statement 0.72 on one, 0.53 on the other), so a comparison
across kinds measures the machines. ``--across-machines`` compares anyway
and says so; the exit status is 2 otherwise. A noise file measured on
another kind is named in the output: its bands may not fit.

``--measure-noise`` takes result files of the *same commit* run back to
back on one kind of machine and prints a noise file: per ratio, the
largest relative difference seen between any two of the runs, (max − min)
/ max, times 1.5 (two or three runs underestimate the spread), and never
below 2 %. A ratio with no measured band gets ``default_band``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from itertools import combinations
from pathlib import Path

NOISE = Path(__file__).resolve().parent / "noise.json"
# A kind of machine's own bands, when measured: noise/<kind's slug>.json.
NOISE_DIR = Path(__file__).resolve().parent / "noise"
DEFAULT_BAND = 0.25
MIN_BAND = 0.02
SAFETY = 1.5


def ratios(result: dict) -> dict[str, dict]:
    """The ratios of a result file that have a value, by name."""
    return {r["name"]: r for r in result.get("ratios", []) if "value" in r}


def fall(op: str, a: float, b: float) -> float:
    """How far B fell from A, relative to A, in the ratio's bad direction
    (negative: it improved)."""
    if op == "==":
        return 0.0 if a == b else float("inf")
    if a == 0:
        if op == ">=":
            return 0.0 if b >= 0 else float("inf")
        return float("inf") if b > 0 else 0.0
    change = (b - a) / abs(a)
    return -change if op == ">=" else change


def machine_kind(result: dict) -> str:
    """What a result file says it ran on: CPU model and cores ("" if it
    does not say: a file from before the field, or a hand-made one)."""
    m = result.get("machine") or {}
    if not m.get("model") and not m.get("cores"):
        return ""
    return f"{m.get('cores')} cores, {m.get('model') or 'unknown CPU'}"


def noise_file(kind: str) -> Path:
    """The noise file for a kind of machine: its own if one was measured
    (``noise/2-cores-amd-epyc.json``), else ``noise.json``."""
    slug = "-".join(re.findall(r"[a-z0-9]+", kind.lower()))
    own = NOISE_DIR / f"{slug}.json"
    return own if slug and own.exists() else NOISE


def compare(a: dict, b: dict, noise: dict) -> list[dict]:
    """One row per ratio in A or B: its two values, its fall, its band and a
    verdict (regressed, improved, within noise, new, gone)."""
    bands = noise.get("bands", {})
    default = float(noise.get("default_band", DEFAULT_BAND))
    ra, rb = ratios(a), ratios(b)
    rows = []
    for name in list(ra) + [n for n in rb if n not in ra]:
        x, y = ra.get(name), rb.get(name)
        if x is None or y is None:
            rows.append({"name": name, "a": x and x["value"], "b": y and y["value"],
                         "verdict": "new" if x is None else "gone"})  # fmt: skip
            continue
        op = y.get("op", x.get("op", ">="))
        band = float(bands.get(name, default))
        f = fall(op, float(x["value"]), float(y["value"]))
        if f > band:
            verdict = "regressed"
        elif f < -band:
            verdict = "improved"
        else:
            verdict = "within noise"
        rows.append({"name": name, "a": x["value"], "b": y["value"], "op": op, "fall": f,
                     "band": band, "measured_band": name in bands, "verdict": verdict,
                     "met_b": y.get("met")})  # fmt: skip
    return rows


def measure_noise(results: list[dict], *, mixed_commits: bool = False) -> dict:
    """A noise file from runs of the same commit (``mixed_commits``: runs of
    different commits allowed, and their commits recorded: a band measured
    so is wider than the noise, never narrower, if the code changed)."""
    shas = {r.get("commit", {}).get("sha") for r in results}
    if len(shas) != 1 and not mixed_commits:
        raise ValueError(f"noise must be measured on one commit; these runs have {sorted(shas)}")
    kinds = {machine_kind(r) for r in results}
    if len(kinds) != 1:
        raise ValueError(
            f"noise must be measured on one kind of machine; these ran on {sorted(kinds)}"
        )
    bands: dict[str, float] = {}
    spreads: dict[str, list[float]] = {}
    for x, y in combinations(results, 2):
        rx, ry = ratios(x), ratios(y)
        for name in rx.keys() & ry.keys():
            a, b = float(rx[name]["value"]), float(ry[name]["value"])
            top = max(abs(a), abs(b))
            spread = 0.0 if top == 0 else abs(a - b) / top
            spreads.setdefault(name, []).append(spread)
    for name, values in sorted(spreads.items()):
        bands[name] = round(max(MIN_BAND, SAFETY * max(values)), 3)
    return {
        "how": (
            f"bench/compare.py --measure-noise on {len(results)} runs of "
            + ("one commit" if len(shas) == 1 else f"{len(shas)} commits (--mixed-commits)")
            + ": per ratio "
            f"{SAFETY} x the largest (max - min) / max between two runs, at least {MIN_BAND}"
        ),
        "commits": sorted(str(x) for x in shas),
        "runs": [
            {"date": r.get("date"), "machine": r.get("machine"), "sizes": r.get("sizes")}
            for r in results
        ],
        "default_band": DEFAULT_BAND,
        "bands": bands,
    }


def render(rows: list[dict]) -> str:
    lines = [f"{'ratio':<36} {'A':>10} {'B':>10} {'fall':>8} {'band':>7}  verdict", "-" * 84]
    for r in rows:
        if "fall" not in r:
            lines.append(f"{r['name']:<36} {r['a']!s:>10} {r['b']!s:>10} {'':>8} {'':>7}  "
                         f"{r['verdict']}")  # fmt: skip
            continue
        band = f"{r['band']:.0%}" + ("" if r["measured_band"] else "*")
        fall_s = "inf" if r["fall"] == float("inf") else f"{r['fall']:+.1%}"
        lines.append(
            f"{r['name']:<36} {r['a']:>10.3f} {r['b']:>10.3f} {fall_s:>8} {band:>7}  "
            f"{r['verdict'].upper() if r['verdict'] == 'regressed' else r['verdict']}"
        )
    lines.append("(* no measured band: the default)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--noise", type=Path, default=None,
                        help="default: noise/<B's machine>.json, else noise.json")  # fmt: skip
    parser.add_argument("--measure-noise", action="store_true")
    parser.add_argument(
        "--mixed-commits",
        action="store_true",
        help="with --measure-noise: accept runs of different commits",
    )
    parser.add_argument("--across-machines", action="store_true",
                        help="compare files from different kinds of machine")  # fmt: skip
    args = parser.parse_args(argv)
    results = [json.loads(p.read_text()) for p in args.files]
    if args.measure_noise:
        if len(results) < 2:
            parser.error("--measure-noise needs two or more result files")
        noise = measure_noise(results, mixed_commits=args.mixed_commits)
        print(json.dumps(noise, indent=1, sort_keys=True))
        return 0
    if len(results) != 2:
        parser.error("compare takes two result files: A (before) and B (after)")
    a, b = results
    kind_a, kind_b = machine_kind(a), machine_kind(b)
    noise_path = args.noise or noise_file(kind_b)
    noise = json.loads(noise_path.read_text()) if noise_path.exists() else {}
    for label, r, kind in (("A", a, kind_a), ("B", b, kind_b)):
        print(f"{label}: {r.get('date')} {r.get('commit', {}).get('sha', '')[:10]} ({kind or '?'})")
    if kind_a != kind_b:
        if not args.across_machines:
            print(
                "A and B ran on different kinds of machine: their difference is the "
                "machines' as much as the code's. Run both on one (a frozen worktree of "
                "each commit, the same hour), or pass --across-machines.",
                file=sys.stderr,
            )
            return 2
        print("ACROSS MACHINES: the verdicts below compare the machines too")
    print(f"noise bands: {noise_path}")
    noise_kinds = {machine_kind(r) for r in noise.get("runs", [])} - {""}
    if noise_kinds and kind_b and noise_kinds != {kind_b}:
        print(f"the noise bands were measured on {', '.join(sorted(noise_kinds))}: "
              "they may be narrower than this machine's noise")  # fmt: skip
    rows = compare(a, b, noise)
    print(render(rows))
    regressed = [r["name"] for r in rows if r["verdict"] == "regressed"]
    if regressed:
        print(f"\nREGRESSED beyond the noise: {', '.join(regressed)}")
        return 1
    print("\nno ratio fell by more than its noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
