"""Where a gunicorn worker's time goes, by part of the request: the
``py-spy record --format raw`` stacks of bench/http.py's ``--py-spy`` phase
(or any such file: ``python bench/http_profile.py FILE [REQUESTS] [RATE]``).

Each sample is a stack, root first. It is charged to the part named by the
deepest frame that names one (``PARTS``, first matching rule per frame), so
a middleware's share is its own work, not what runs under its
``get_response``; a sample inside psycopg or ``django.db`` is charged to
PostgreSQL, split by what asked (the health check's ``SELECT 1``, the
admission statement, the auth lookup, the rest). Samples outside
``SyncWorker.handle`` (the worker idle in ``select``, the arbiter) are left
out: the table is the request's time, 100 % in all.

py-spy samples a worker whether it runs or waits (psycopg's wait for the
server is not seen as idle, and on a loaded machine a runnable process
waiting for a core is sampled too), so a share is of the request's wall
time in the worker. Proportions, not CPU seconds: they stay meaningful on
a shared machine, and ms per request (samples / rate / requests) is only
as steady as the load.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import sysconfig
from collections import Counter
from pathlib import Path

# (part, file pattern, function pattern): the first rule that matches a
# frame names its part; a frame no rule matches keeps its caller's part.
PARTS: list[tuple[str, str, str]] = [
    ("gunicorn: HTTP parse and socket writes", r"^gunicorn/", r""),
    ("Django: URL resolution", r"^django/urls/", r""),
    ("Django: request signals (connection bookkeeping)", r"^django/db/__init__\.py$", r""),
    ("middleware: request id and trace (core/tracing.py)", r"^core/tracing\.py$", r""),
    ("middleware: error shape, input guard (core/middleware.py)", r"^core/middleware\.py$", r""),
    ("middleware: whitenoise", r"^whitenoise/", r""),
    ("middleware: sessions", r"^django/contrib/sessions/", r""),
    ("middleware: auth (session user)", r"^django/contrib/auth/", r""),
    ("middleware: messages", r"^django/contrib/messages/", r""),
    ("middleware: CSP", r"^csp/", r""),
    ("middleware: django-htmx", r"^django_htmx/", r""),
    ("middleware: axes", r"^axes/", r""),
    ("middleware: Django's security, common, csrf, clickjacking", r"^django/middleware/", r""),
    ("fair share (core/fairshare.py)", r"^(core/fairshare\.py|limits/|redis/)", r""),
    ("auth: bearer key (accounts/)", r"^(accounts/|ninja/security/)", r""),
    ("ninja: response rendering", r"^ninja/", r"(_result_to_response|create_response|render)"),
    ("ninja: routing, body parsing and validation", r"^(ninja/|pydantic|core/inputs\.py)", r""),
    ("route: create_ticket (tickets/api.py)", r"^tickets/api\.py$", r""),
    ("bench floor route", r"http_urls\.py$", r""),
    ("trace join (tickets/traces.py)", r"^tickets/traces\.py$", r""),
    (
        "metrics (core/observe.py, prometheus_client)",
        r"^(core/observe\.py|prometheus_client/)",
        r"",
    ),
    ("logging", r"^(logging/|core/logs\.py|structlog/)", r""),
    ("payload: canonical JSON (core/canonical.py)", r"^core/canonical\.py$", r""),
    ("admission: Python (tickets/admission.py)", r"^tickets/admission\.py$", r""),
    ("response: ticket payload (tickets/selectors.py)", r"^tickets/selectors\.py$", r""),
    ("Django: request, response, handler", r"^(django/core/|django/http/|django/dispatch/)", r""),
]
# A frame in the database client (psycopg, Django's backend) charges
# PostgreSQL, named after who asked: the wait for the server and the
# client's own work for the statement.
_DB = re.compile(r"^(psycopg|psycopg_c|django/db/backends/)")
_SERVER = "gunicorn: HTTP parse and socket writes"
_HANDLER = "Django: request, response, handler"
_PARSING = "ninja: routing, body parsing and validation"
_RENDERING = "ninja: response rendering"
_HEALTH = "PostgreSQL: the health check (CONN_HEALTH_CHECKS)"
_HEALTH_CHECK = re.compile(r"^\S*is_usable \(django/db/backends/")
_COMPILED = [(part, re.compile(f), re.compile(fn)) for part, f, fn in PARTS]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):\d+\)$")
_IN_REQUEST = "SyncWorker.handle "


def py_spy_binary() -> str:
    """py-spy from the virtual environment (``make bench-install``) or PATH."""
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is missing: make bench-install")
    return found


def _part_of(func: str, file: str) -> str | None:
    for part, file_re, func_re in _COMPILED:
        if file_re.search(file) and func_re.search(func):
            return part
    return None


def _db_part(asker: str) -> str:
    """The database's part of a sample: the statement, named by who asked."""
    if asker.startswith("admission"):
        return "PostgreSQL: the admission statement"
    if asker == "bench floor route":
        return "PostgreSQL: the floor's insert"
    if asker.startswith("auth"):
        return "PostgreSQL: the key lookup"
    return f"PostgreSQL: asked by {asker}"


def attribute(text: str, start_frame: str = _IN_REQUEST) -> Counter:
    """Samples per part, for the samples inside a request (under the frame
    whose text starts with ``start_frame``)."""
    parts: Counter = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        start = next((i for i, f in enumerate(frames) if f.startswith(start_frame)), None)
        if start is None:
            continue
        part = _SERVER
        for depth, frame in enumerate(frames[start:], start):
            match = _FRAME.match(frame)
            if match is None:
                continue
            func, file = match["func"], match["file"]
            if _DB.match(file):
                # The health check runs inside the first cursor's set-up.
                checking = any(_HEALTH_CHECK.search(f) for f in frames[depth:])
                part = _HEALTH if checking else _db_part(part)
                break
            named = _part_of(func, file)
            # Django's request and response plumbing is the handler's part
            # only outside every other part: called from a middleware or a
            # route (a cookie signer, a header lookup), it is theirs.
            # Likewise pydantic under ninja's rendering is the rendering's.
            if named == _PARSING and part == _RENDERING:
                continue
            if named is not None and (named != _HANDLER or part in (_SERVER, _HANDLER)):
                part = named
        parts[part] += int(count)
    return parts


def report(
    text: str,
    *,
    requests: int,
    rate: float,
    start_frame: str = _IN_REQUEST,
    ms_per_request: float | None = None,
) -> str:
    """The table: each part's share of the samples in requests and its ms
    per request, from the sampling rate or, given ``ms_per_request`` (a
    measured figure, e.g. CPU per request), as that share of it."""
    parts = attribute(text, start_frame)
    total = sum(parts.values())
    if not total or not requests:
        return "  no samples inside a request"
    if ms_per_request is None:
        ms_per_request = total / rate / requests * 1e3
    lines = [
        f"  {total} samples in requests, {requests} requests: {ms_per_request:.2f} ms per request",
        f"  {'part':<68} {'share':>6} {'ms/req':>7}",
    ]
    for part, n in parts.most_common():
        lines.append(f"  {part:<68} {n / total:6.1%} {n / total * ms_per_request:7.2f}")
    return "\n".join(lines)


def in_request_share(text: str, start_frame: str) -> float:
    """The share of all samples that fell inside a request."""
    every = sum(int(line.rpartition(" ")[2]) for line in text.splitlines() if line)
    return sum(attribute(text, start_frame).values()) / every if every else 0.0


# --- In process: CPU time, sampled -------------------------------------------------------


class CpuSampler:
    """A sampling profiler of this process's CPU time: ``ITIMER_PROF`` fires
    every ``interval`` seconds of CPU the process uses (user + system, not
    wall time: a wait for PostgreSQL or for a core is never sampled), and
    the handler counts the main thread's stack in py-spy's raw format, so
    ``attribute`` reads both. The kernel fires the timer at its tick (every
    4 ms here whatever ``interval`` asks), so read the samples as shares of
    a CPU time measured apart (``time.process_time``), not as a rate."""

    def __init__(self, interval: float = 0.0005):
        self.interval = interval
        self.stacks: Counter = Counter()
        self._prefixes = sorted(
            {str(Path(p).resolve()) + os.sep for p in (*sys.path, sysconfig.get_paths()["stdlib"])
             if p},
            key=len,
            reverse=True,
        )  # fmt: skip
        self._names: dict[str, str] = {}

    def _short(self, filename: str) -> str:
        name = self._names.get(filename)
        if name is None:
            name = next(
                (filename[len(p) :] for p in self._prefixes if filename.startswith(p)), filename
            )
            self._names[filename] = name
        return name

    def _sample(self, signum, frame) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{code.co_qualname} ({self._short(code.co_filename)}:{frame.f_lineno})")
            frame = frame.f_back
        self.stacks[";".join(reversed(stack))] += 1

    def __enter__(self) -> CpuSampler:
        self._previous = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, self._previous)

    @property
    def rate(self) -> float:
        return 1.0 / self.interval

    def raw(self) -> str:
        return "".join(f"{stack} {n}\n" for stack, n in self.stacks.items())


if __name__ == "__main__":
    path = Path(sys.argv[1])
    reqs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    hz = float(sys.argv[3]) if len(sys.argv) > 3 else 100.0
    print(report(path.read_text(), requests=reqs, rate=hz))
