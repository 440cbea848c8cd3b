"""The system under fault: real processes (gunicorn, the turns and control
Celery workers, beat) against the private PostgreSQL and Redis, a load
generator that admits tickets over HTTP, and the measurements every fault
reports (responses by status, acknowledged / existing / terminal tickets,
replays, the ledger audit)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.waiting import wait_for

from .cluster import PrivatePostgres, PrivateRedis, free_port

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")
STAFF = "faults-staff"
COUNTED = "tests.faults.runners.counted"


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2
) -> Any:
    """``tests.waiting.wait_for`` under the fault suite's argument names."""
    return wait_for(predicate, timeout=timeout, interval=interval, message=what)


# --- The private services, once per session --------------------------------------------------


class Cluster:
    """The private PostgreSQL and Redis, and the fault tests' database. Its
    migration (and a staff API key) runs in the background from the session's
    start until the stack needs it."""

    DB = "faults_ledger"

    def __init__(self) -> None:
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis()
        self.staff_key = ""
        self._setup: subprocess.Popen | None = None

    def up(self) -> Cluster:
        self.pg.init().start()
        self.redis.start()
        self.pg.execute(f"CREATE DATABASE {self.DB}")
        # One interpreter for both steps (Django's start-up costs seconds).
        self._setup = subprocess.Popen(
            [sys.executable, "-c", _LEDGER_SETUP, STAFF],
            cwd=ROOT,
            env={**base_env(), "DATABASE_URL": self.pg.url(self.DB)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return self

    def ready(self) -> Cluster:
        """Wait for the migration; the staff key is then known."""
        if self._setup is not None:
            out, err = self._setup.communicate(timeout=300)
            if self._setup.returncode != 0:
                raise AssertionError(f"migrating the fault tests' database failed:\n{out}\n{err}")
            self.staff_key = out.strip().splitlines()[-1]
            self._setup = None
        return self

    def down(self) -> None:
        if self._setup is not None:
            self._setup.kill()
        self.redis.destroy()
        self.pg.destroy()


_LEDGER_SETUP = """
import sys
import django
django.setup()
from django.core.management import call_command
from accounts.keys import create_api_key
call_command("migrate", "--no-input", verbosity=0)
_, key = create_api_key(username=sys.argv[1], staff=True)
print(key)
"""


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(ROOT),
        C_FORCE_ROOT="1",  # the machine's shells run as root
        # No Django system checks at each Celery start (tests/conftest.py,
        # _test_env): the migration above runs them.
        CELERY_SKIP_CHECKS="1",
        LOG_LEVEL="INFO",
        # Let the test runner be configured on endpoints (the operator's allow-list).
        RUNNER_PYTHON_ALLOWED_PREFIXES="runtime.demo.,tests.faults.runners",
    )
    return env


def manage(env: dict[str, str], *args: str, check: bool = True, timeout: float = 180) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


# --- One fault's stack ----------------------------------------------------------------------


class Stack:
    """Web, workers and beat for one fault test, on a fresh database."""

    def __init__(self, cluster: Cluster, tmp: Path, db_blocker: Any) -> None:
        self.cluster = cluster
        self.db_blocker = db_blocker  # pytest-django's: this process reads the ledger too
        self.pg: PrivatePostgres = cluster.pg
        self.redis: PrivateRedis = cluster.redis
        self.tmp = tmp
        self.db = cluster.DB
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.counter_file = tmp / "executions.log"
        self.counter_file.touch()
        (tmp / "var").mkdir(exist_ok=True)
        self.env = {
            **base_env(),
            "DATABASE_URL": self.pg.url(self.db),
            "CELERY_BROKER_URL": self.redis.url(0),
            "CLAIMCHECK_VAR_DIR": str(tmp / "var"),
            "SECRET_KEY": "fault-tests-only-" + "x" * 40,
            # Sweeps every second: fast enough to measure, light enough for a
            # loaded 2-core machine.
            "SWEEP_INTERVAL_S": "1",
            "REDISPATCH_AFTER_S": "2",
            "FAULTS_COUNTER_FILE": str(self.counter_file),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = Counter()
        self.http = httpx.Client(base_url=self.base_url, timeout=30)  # auth once migrated

    # --- processes ---

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.starts[name] += 1
        with open(self.tmp / f"{name}.log", "ab") as log:
            log.write(f"\n=== start {self.starts[name]} ===\n".encode())
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env_for(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill it whole
            )

    def env_for(self, name: str) -> dict[str, str]:
        """The environment ``name`` starts with (a stack behind a pooler
        gives its pooled processes another ``DATABASE_URL``)."""
        return self.env

    def _offset(self, name: str) -> int:
        """Where the current run's part of the log begins."""
        text = self.log(name)
        marker = f"=== start {self.starts[name]} ===".encode()
        return max(text.rfind(marker), 0)

    def spawn_web(self) -> None:
        self._spawn(
            "web",
            [
                sys.executable, "-m", "gunicorn", "config.wsgi:application",
                "-b", f"127.0.0.1:{self.port}", "-w", "2", "-k", "gthread", "--threads", "8",
                "--timeout", "60", "--graceful-timeout", "5", "--access-logfile", "-",
            ],
        )  # fmt: skip

    def spawn_worker(self, name: str, queue: str, concurrency: int, *, flags: bool = True) -> None:
        """A Celery worker as the deployment starts it; ``flags=False``: the
        command without ``--without-gossip --without-mingle`` (config/celery.py
        must turn both off by itself)."""
        self._spawn(
            name,
            [
                sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue,
                "-c", str(concurrency), "-n", f"{name}@%h",
                *(["--without-gossip", "--without-mingle"] if flags else []),
                "--loglevel", "INFO",
            ],
        )  # fmt: skip

    def spawn_beat(self) -> None:
        self._spawn(
            "beat",
            [
                sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
                "-s", str(self.tmp / "beat-schedule"),
            ],
        )  # fmt: skip

    def ready(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise AssertionError(
                f"{name} exited:\n{self.log(name)[-4000:].decode(errors='replace')}"
            )
        recent = self.log(name)[self._offset(name) :]
        if name == "web":
            try:
                return self.http.get("/api/v1/openapi.json", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        if name == "beat":
            # Routine "Sending due task" lines are DEBUG (core/logs.py).
            return b"beat: Starting" in recent
        return b" ready." in recent

    def wait_ready(self, *names: str, timeout: float = 120) -> None:
        for name in names:
            wait_until(lambda n=name: self.ready(n), timeout=timeout, what=f"{name} to be ready")

    # name -> how to start it; ``start`` and ``ensure_running`` use these.
    def _spawners(self) -> dict[str, Callable[[], None]]:
        out: dict[str, Callable[[], None]] = {"web": self.spawn_web}
        for i, (name, concurrency) in enumerate(self.turns):
            # Every turns worker after the first is started as a command that
            # forgot the gossip and mingle flags.
            out[name] = lambda n=name, c=concurrency, f=(i == 0): self.spawn_worker(
                n, "turns", c, flags=f
            )
        out["control"] = lambda: self.spawn_worker("control", "control", self.control)
        out["beat"] = self.spawn_beat
        return out

    def start(
        self, *, turns: Iterable[tuple[str, int]] = (("turns", 4),), control: int = 2
    ) -> Stack:
        """Every process at once (start-up is slow on a loaded machine), once
        the database is migrated: a process that writes while a migration
        alters the table (a worker registering, a sweep) can deadlock it, as
        in production, where migrations run before the processes start."""
        self.turns, self.control = list(turns), control
        spawners = self._spawners()
        self.cluster.ready()
        for spawn in spawners.values():
            spawn()
        self.http.headers["Authorization"] = f"Bearer {self.cluster.staff_key}"
        self.wait_ready(*spawners)
        return self

    def respawn(self, name: str) -> None:
        self._spawners()[name]()

    def ensure_running(self) -> list[str]:
        """Start again whatever is not running (a test that failed half-way
        must not take the next one down with it); returns what was started."""
        spawners = self._spawners()
        dead = [n for n in spawners if n not in self.procs or self.procs[n].poll() is not None]
        for name in dead:
            self.procs.pop(name, None)
            spawners[name]()
        self.wait_ready(*spawners)
        return dead

    def pids(self, name: str) -> set[int]:
        """Every live process of ``name``'s process group (a worker's pool too)."""
        return _group_pids(self.procs[name].pid)

    def db_sessions(self, name: str) -> set[int]:
        """The PostgreSQL backends serving ``name``'s processes: their TCP
        connections to the private cluster, matched by client port."""
        import psutil

        ports = set()
        for pid in self.pids(name):
            with contextlib.suppress(psutil.Error):
                for conn in psutil.Process(pid).net_connections(kind="tcp"):
                    if conn.raddr and conn.raddr.port == self.pg.port:
                        ports.add(conn.laddr.port)
        if not ports:
            return set()
        rows = self.sql(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", [sorted(ports)]
        )
        return {pid for (pid,) in rows}

    def sessions_ended(self, backends: set[int], what: str) -> None:
        """Wait until none of ``backends`` is left: a killed client's session
        ends once its backend has read the closed socket, and a statement it
        was running has then committed or rolled back."""
        wait_until(
            lambda: (
                not self.sql(
                    "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [sorted(backends)]
                )
            ),
            timeout=20,
            what=what,
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # A SIGKILLed worker's pool children die with the group (orphans may
        # linger as zombies: they count as gone).
        wait_until(lambda: not _group_pids(proc.pid), timeout=20, what=f"{name} to exit")

    def log(self, name: str) -> bytes:
        path = self.tmp / f"{name}.log"
        return path.read_bytes() if path.exists() else b""

    def teardown(self) -> None:
        """SIGKILL: nothing is measured any more, and a warm shutdown would
        wait for a turn that ignores interrupts."""
        self.http.close()
        for name in list(self.procs):
            with contextlib.suppress(Exception):
                self.kill(name, signal.SIGKILL)

    # --- the ledger, read directly ---

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.pg.url(self.db), autocommit=True, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()

    @staticmethod
    def runner(**options: Any) -> dict:
        """The fault suite's counting python runner, with runner options."""
        return {"kind": "python", "path": COUNTED, **options}

    def create_endpoint(self, address: str, **fields: Any) -> dict:
        body = {"address": address, "runner": self.runner()}
        body.update(fields)
        resp = self.http.post("/api/v1/endpoints", json=body)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def executions(self) -> Counter:
        """How many times each ticket's runner ran (the counter file)."""
        lines = self.counter_file.read_text().splitlines()
        return Counter(json.loads(line)["ticket"] for line in lines if line.strip())

    def states(self, ids: Iterable[str]) -> dict[str, str]:
        rows = self.sql(
            "SELECT id::text, state FROM tickets_ticket WHERE id = ANY(%s)", [list(ids)]
        )
        return dict(rows)

    def wait_terminal(
        self, ids: set[str], timeout: float, *, stall_s: float = 60, cap_s: float = 900
    ) -> dict[str, str]:
        """The states of ``ids`` once all are terminal, or as soon as one is
        ``recovering`` (only an owner's decision ends that), or when nothing
        has finished for ``stall_s`` after ``timeout`` (a backlog on a loaded
        machine drains slowly, but it drains: stuck is no progress), or at
        ``cap_s``. ``unfinished`` says what is left."""
        start = time.monotonic()
        progress = {"done": -1, "at": start}

        def settled():
            states = self.states(ids)
            finished = sum(1 for s in states.values() if s in TERMINAL)
            if finished == len(ids) and len(states) == len(ids):
                return (states,)  # a tuple: no ids, an empty dict, is an answer too
            if "recovering" in states.values():
                return (states,)
            now = time.monotonic()
            if finished > progress["done"]:
                progress.update(done=finished, at=now)
            stalled = now - start > timeout and now - progress["at"] > stall_s
            return (states,) if now - start > cap_s or stalled else None

        # Past cap_s the predicate answers: the helper's own deadline is a backstop.
        (states,) = wait_for(
            settled, timeout=cap_s + 60, interval=0.5, message="the tickets to settle"
        )
        return states

    def audit(self) -> dict:
        """``manage.py audit_ledger --json`` on this stack's database, run in
        this process (a new interpreter costs seconds on a loaded machine)
        through a database alias of its own."""
        from io import StringIO

        from django.core.management import call_command
        from django.core.management.base import CommandError
        from django.db import connections

        alias = f"faults_{self.db}"
        if alias not in connections.databases:
            connections.databases[alias] = {
                **connections.databases["default"],
                "NAME": self.db,
                "HOST": "127.0.0.1",
                "PORT": self.pg.port,
                "USER": "postgres",
                "PASSWORD": "",
                "CONN_MAX_AGE": 0,
            }
        out = StringIO()
        with self.db_blocker.unblock():
            try:
                call_command(
                    "audit_ledger", "--json", "--database", alias,
                    "--in-flight-s", self.env["REDISPATCH_AFTER_S"], stdout=out,
                )  # fmt: skip
            except CommandError:
                pass  # violations: the JSON says which
            finally:
                connections[alias].close()
        return json.loads(out.getvalue())

    def replays(self) -> dict[str, int]:
        """Tickets whose work ran more than once: by the runner's own count,
        and by turns in the ledger."""
        counted = {t: n for t, n in self.executions().items() if n > 1}
        turns = dict(
            self.sql(
                "SELECT ticket_id::text, count(*) FROM runtime_turn GROUP BY ticket_id "
                "HAVING count(*) > 1"
            )
        )
        return {**turns, **counted}


def _group_pids(pgid: int) -> set[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.add(int(entry))
    return found


def unfinished(ids: set[str], states: dict[str, str]) -> str:
    """Empty when every ticket exists and is terminal; else what is not."""
    stuck = {i: s for i, s in states.items() if s not in TERMINAL}
    missing = ids - set(states)
    if not stuck and not missing:
        return ""
    return (
        f"{len(stuck)} acknowledged ticket(s) not terminal ({dict(Counter(stuck.values()))}), "
        f"{len(missing)} missing; e.g. {list(stuck.items())[:3]} {list(missing)[:3]}"
    )


# --- Load over HTTP -------------------------------------------------------------------------


@dataclass
class Response:
    key: str
    endpoint: str
    status: int | str  # an HTTP status, or "timeout" / "error"
    ticket: str | None
    code: str | None  # the JSON error code
    json_body: bool
    at: float  # monotonic, when sent
    elapsed: float
    snippet: str = ""
    # Transport errors before this answer, each retried with the same dedupe
    # key as a client would (gunicorn's gthread worker can reset a keep-alive
    # connection it is closing just as the client reuses it: benoitc/gunicorn#1698).
    retried: tuple[str, ...] = ()


@dataclass
class Load:
    """Threads that admit tickets over HTTP, each with its own dedupe key,
    spread over ``endpoints``, until stopped."""

    stack: Stack
    endpoints: list[str]
    input: dict[str, Any] = field(default_factory=lambda: {"seconds": 0.2})
    threads: int = 2
    pause_s: float = 0.25
    timeout_s: float = 20.0
    prefix: str = "load"
    # Same-key retries of a request that met a transport error (not a timeout).
    transport_retries: int = 2

    def __post_init__(self) -> None:
        self.results: list[Response] = []
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._n = itertools.count()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.started = self.stopped = 0.0

    def mark(self, label: str) -> None:
        self.marks[label] = time.monotonic()

    def one(self, client: httpx.Client, i: int) -> Response:
        key = f"{self.prefix}-{i}"
        endpoint = self.endpoints[i % len(self.endpoints)]
        body = {"endpoint": endpoint, "input": self.input, "dedupe_key": key}
        retried: list[str] = []
        while True:
            t0 = time.monotonic()
            try:
                resp = client.post("/api/v1/tickets", json=body)
            except httpx.TimeoutException:
                return Response(
                    key, endpoint, "timeout", None, None, False, t0, time.monotonic() - t0,
                    retried=tuple(retried),
                )  # fmt: skip
            except httpx.HTTPError as exc:
                if len(retried) < self.transport_retries:
                    retried.append(repr(exc))
                    continue
                return Response(
                    key, endpoint, "error", None, None, False, t0, time.monotonic() - t0,
                    repr(exc), tuple(retried),
                )  # fmt: skip
            break
        elapsed = time.monotonic() - t0
        is_json = resp.headers.get("content-type", "").startswith("application/json")
        data = resp.json() if is_json else {}
        ticket = data.get("id") if resp.status_code in (200, 201) else None
        return Response(
            key, endpoint, resp.status_code, ticket, data.get("error"), is_json, t0, elapsed,
            "" if is_json else resp.text[:300], tuple(retried),
        )  # fmt: skip

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.stack.base_url,
            headers={"Authorization": f"Bearer {self.stack.cluster.staff_key}"},
            timeout=self.timeout_s,
        ) as client:
            while not self._stop.is_set():
                result = self.one(client, next(self._n))
                with self._lock:
                    self.results.append(result)
                self._stop.wait(self.pause_s)

    def start(self) -> Load:
        self.started = time.monotonic()
        for _ in range(self.threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        self.stopped = time.monotonic()

    def wait_for_count(self, n: int, timeout: float = 60) -> None:
        wait_until(lambda: len(self.results) >= n, timeout=timeout, what=f"{n} admissions")

    @property
    def acknowledged(self) -> set[str]:
        return {r.ticket for r in self.results if r.status in (200, 201) and r.ticket}

    def statuses(self, since: float | None = None, until: float | None = None) -> Counter:
        return Counter(
            str(r.status)
            for r in self.results
            if (since is None or r.at >= since) and (until is None or r.at <= until)
        )


def figures(
    fault: str,
    stack: Stack,
    load: Load | None,
    *,
    acknowledged: set[str] | None = None,
    audit: dict | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The measured line of one fault."""
    acknowledged = set(acknowledged if acknowledged is not None else load.acknowledged)
    states = stack.states(acknowledged) if acknowledged else {}
    replays = stack.replays()
    out: dict[str, Any] = {"fault": fault}
    if load is not None:
        out["load"] = {
            "admissions": len(load.results),
            "seconds": round((load.stopped or time.monotonic()) - load.started, 1),
            "max_latency_s": round(max((r.elapsed for r in load.results), default=0), 2),
        }
        out["responses"] = dict(sorted(load.statuses().items()))
        retried = [e for r in load.results for e in r.retried]
        if retried:
            out["transport_errors_retried"] = {"count": len(retried), "first": retried[0]}
    out.update(
        acknowledged=len(acknowledged),
        existing=len(states),
        terminal=sum(1 for s in states.values() if s in TERMINAL),
        states=dict(Counter(states.values())),
        replays=len(replays),
    )
    out.update(extra)
    if audit is not None:
        out["audit"] = "clean" if audit.get("ok") else audit.get("counts")
        out["audit_s"] = audit.get("seconds")
    return out
