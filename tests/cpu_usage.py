"""CPU seconds per test file: what a run costs on a shared machine, where
wall time is noise (the load of other work, not of ours).

Each test's phases (setup, call, teardown) carry the CPU the pytest process
used since the previous phase, its own plus that of the children it has
reaped (``RUSAGE_CHILDREN``: a Celery worker, gunicorn or a private
PostgreSQL is counted once it is stopped and waited for, with the children
it reaped itself). The figures ride on the report's ``user_properties``, so
they reach xdist's controlling process, which sums them per file, prints the
heaviest with ``--cpu-report`` and writes them all to the JSON file it names.

A fixture shared by many files (the session's worker) is counted where it
is stopped: the last test of that xdist worker.

    pytest --cpu-report var/cpu.json tests/endpoints/test_turns.py
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

PROPERTY = "cpu_s"


def _cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuUsage:
    def __init__(self, path: str):
        self.path = Path(path)
        self.last: float | None = None
        self.per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        self.started = time.monotonic()

    # In every process that runs tests (an xdist worker, or the only one).
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        now = _cpu_now()
        spent = now - (self.last if self.last is not None else now)
        self.last = now
        outcome.get_result().user_properties.append((PROPERTY, round(spent, 3)))

    def pytest_runtestloop(self, session):
        # Collection and Django's setup are not any file's.
        self.last = _cpu_now()

    # In the controlling process (or the only one).
    def pytest_runtest_logreport(self, report):
        for name, value in report.user_properties:
            if name == PROPERTY:
                entry = self.per_file[report.location[0]]
                entry[0] += value
                entry[1] += report.duration
                if report.when == "call":
                    entry[2] += 1

    def pytest_terminal_summary(self, terminalreporter):
        if not self.per_file:
            return
        rows = sorted(self.per_file.items(), key=lambda kv: -kv[1][0])
        total = sum(v[0] for _, v in rows)
        load = [round(x, 2) for x in os.getloadavg()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            json.dumps(
                {
                    "cpu_s_total": round(total, 1),
                    "wall_s": round(time.monotonic() - self.started, 1),
                    "loadavg_at_end": load,
                    "files": {
                        f: {"cpu_s": round(c, 1), "test_s": round(w, 1), "tests": n}
                        for f, (c, w, n) in rows
                    },
                },
                indent=2,
            )
        )
        terminalreporter.section("CPU seconds per file (self + reaped children)")
        for f, (c, w, n) in rows[:25]:
            terminalreporter.write_line(f"{c:8.1f} cpu-s {w:8.1f} test-s {n:4d}  {f}")
        terminalreporter.write_line(
            f"{total:8.1f} cpu-s in all; load average {load}; written to {self.path}"
        )


# Called from tests/conftest.py's hooks of the same names.
def pytest_addoption(parser):
    parser.addoption(
        "--cpu-report",
        metavar="PATH",
        default=None,
        help="sum the CPU seconds (self + reaped children) of each test file, "
        "print the heaviest and write them all to PATH (tests/cpu_usage.py)",
    )


def pytest_configure(config):
    path = config.getoption("--cpu-report")
    if path:
        config.pluginmanager.register(CpuUsage(path), "cpu_usage")


def file_seconds(path: Path) -> dict[str, float]:
    """``{file: seconds}`` from a file ``main`` wrote; {} when there is none."""
    try:
        return {f: float(s) for f, s in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def main(argv: list[str]) -> None:
    """``python -m tests.cpu_usage var/cpu.json``: each file's test seconds of
    that report, slowest first, into tests/file_seconds.json (read by
    tests/conftest.py to collect the slowest files first)."""
    report = json.loads(Path(argv[0]).read_text())
    rows = sorted(report["files"].items(), key=lambda kv: -kv[1]["test_s"])
    out = Path(__file__).resolve().parent / "file_seconds.json"
    out.write_text(json.dumps({f: v["test_s"] for f, v in rows}, indent=1) + "\n")
    print(f"{len(rows)} files written to {out}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
