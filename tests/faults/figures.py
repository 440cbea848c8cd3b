"""The figures each fault measures: attached to the test's report (so they
reach the controlling process under pytest-xdist), printed at the end of the
run and written to ``var/faults/figures.json`` (or ``$FAULTS_FIGURES``).
The hooks that collect and write them are in tests/conftest.py: a
subdirectory's conftest is not loaded in xdist's controlling process."""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PROPERTY = "fault_figures"
# `make faults` sets FAULTS_FULL=1: more iterations; `make test` runs the
# reduced set.
FULL = os.environ.get("FAULTS_FULL") == "1"

_FIGURES: list[dict] = []


def collect(report) -> None:
    """pytest_runtest_logreport: keep the figures a fault's call recorded."""
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == PROPERTY:
            _FIGURES.append(json.loads(value))


def _machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_end": [round(x, 2) for x in load] if load else None,
    }


def summarise(terminalreporter) -> None:
    """pytest_terminal_summary: print the figures and write the file."""
    if not _FIGURES:
        return
    path = Path(os.environ.get("FAULTS_FIGURES", ROOT / "var" / "faults" / "figures.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "set": "full" if FULL else "reduced",
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "faults": _FIGURES,
    }
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
    terminalreporter.section("fault figures")
    for fig in _FIGURES:
        terminalreporter.write_line(json.dumps(fig, sort_keys=True))
    terminalreporter.write_line(f"(written to {path}, {time.strftime('%Y-%m-%d %H:%M:%S')})")
