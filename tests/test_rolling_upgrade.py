"""A rolling upgrade from the previous release, in docs/howto/upgrade.md's order,
under steady admissions, with work parked across it.

The previous release is the newest CHANGELOG.md names by its commit; its
tree is exported with ``git archive`` (tests/config/test_schema_upgrade.py)
and runs with its own code: it migrates a scratch database, seeds it with
its own commands, and serves it with a gunicorn web and a Celery worker
(turns + control, with beat). Then, while it keeps serving:

1. this tree's ``migrate`` runs;
2. this tree's web and worker start beside the old ones (admissions go to
   both webs);
3. the old web and worker drain (out of the rotation, then SIGTERM:
   gunicorn's graceful stop, Celery's warm shutdown) and stop; this tree's
   beat starts;
4. ``post_deploy`` drops what the release retired.

Two turns are held open on the old worker from before the migrate: one is
let go once the new release runs beside it (the old code finishes it on the
new schema), the other is still running at the warm shutdown, which
interrupts it (design.md, "Worker shutdown": the ticket fails
``interrupted``, the stop recorded by the old worker itself).

Then: every acknowledged admission exists and is terminal (succeeded, but
for a turn the shutdown cut), no response was other than 200/201, no
process logged a missing function or a traceback, every turn was finished
by a process of the release that started it and none ran twice, the ticket
waiting on its children and the agent exchange waiting on an owner's
approval (both parked under the old release) complete under the new one,
and this tree's ``audit_ledger`` exits 0.

A function's signature changed in place (the old installer's DROP and
CREATE) fails it as soon as the old worker calls the function: its log shows
``function ... does not exist``.

Private Redis, a scratch database on the test run's PostgreSQL server; the
processes connect as the application role where the run has one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings

from tests.config.test_schema_upgrade import (  # noqa: F401  (scratch: a fixture)
    ROOT,
    _export,
    _migrate,
    _owner,
    _url,
    previous_release,
    scratch,
)
from tests.faults.cluster import PrivateRedis, free_port
from tests.faults.stack import _group_pids
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.integration,
    # Minutes on a loaded machine: `make upgrade-test` (which .ci/run runs).
    pytest.mark.skipif(os.environ.get("UPGRADE_TEST") != "1", reason="`make upgrade-test` runs it"),
]

TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")
RUNNER_DIR = Path(__file__).resolve().parent / "upgrade"  # upgrade_runner.py, alone
LOAD_ENDPOINTS = [f"load.{i}" for i in range(6)]


def _app_url(database: str) -> str:
    """What the web and the workers connect as: the application role (trust
    on 127.0.0.1, as for the suite's own processes), else the owner."""
    role = settings.DATABASE_APP_ROLE
    if not role:
        return _url(database)
    o = _owner()
    return f"postgres://{role}@{o['host']}:{o['port']}/{database}"


class Release:
    """One release's processes: a tree, its environment, its logs."""

    def __init__(self, name: str, tree: Path, database: str, redis: PrivateRedis, tmp: Path):
        self.name, self.tree, self.database, self.tmp = name, tree, database, tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: dict[str, set[int]] = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # One directory for both releases, as a host's /var/lib/claimcheck:
        # artifacts (an agent's parked conversation) and generated secrets.
        var = tmp / "var"
        var.mkdir(exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DATABASE_", "CELERY_", "PYTEST", "DJANGO_"))
        }
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            # The tree first: its config, apps and runners are the release's.
            PYTHONPATH=f"{tree}{os.pathsep}{RUNNER_DIR}",
            DATABASE_URL=_app_url(database),
            # As `make test` runs: prepared calls, planned once per session,
            # are what a function replaced under a running release must survive.
            DATABASE_PREPARED_CALLS="1",
            DATABASE_LISTEN_URL="",
            CELERY_BROKER_URL=redis.url(0),
            CLAIMCHECK_VAR_DIR=str(var),
            SECRET_KEY="rolling-upgrade-tests-only-" + "x" * 40,
            C_FORCE_ROOT="1",  # the machine's shells run as root
            LOG_LEVEL="INFO",
            RUNNER_PYTHON_ALLOWED_PREFIXES="runtime.demo.,upgrade_runner.",
            SWEEP_INTERVAL_S="1",
            REDISPATCH_AFTER_S="2",
            UPGRADE_RELEASE=name,
        )
        self.env = env

    def manage(self, *args: str, owner: bool = False, timeout: float = 240) -> str:
        env = dict(self.env)
        if owner:  # migrate and post_deploy: the owner role, as upgrade.md says
            env["DATABASE_URL"] = _url(self.database)
            if settings.DATABASE_APP_ROLE:
                env["DATABASE_APP_ROLE"] = settings.DATABASE_APP_ROLE
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=self.tree, env=env,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{self.name}: manage.py {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def spawn(self, what: str, argv: list[str]) -> None:
        log = open(self.log_path(what), "ab")  # noqa: SIM115  (the child keeps it)
        self.procs[what] = subprocess.Popen(
            [sys.executable, "-m", *argv], cwd=self.tree, env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()

    def log_path(self, what: str) -> Path:
        return self.tmp / f"{self.name}-{what}.log"

    def log(self, what: str) -> str:
        path = self.log_path(what)
        return path.read_text(errors="replace") if path.exists() else ""

    def start_web(self) -> None:
        self.spawn(
            "web",
            ["gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{self.port}",
             "-w", "2", "-k", "gthread", "--threads", "4", "--timeout", "60",
             "--graceful-timeout", "20", "--access-logfile", "-"],
        )  # fmt: skip

    def start_worker(self, queues: str, *, beat: bool) -> None:
        self.spawn(
            "worker",
            ["celery", "-A", "config", "worker", "-Q", queues, "-c", "4",
             "-n", f"{self.name}@%h", "--without-gossip", "--without-mingle",
             "--loglevel", "INFO",
             *(["-B", "-s", str(self.tmp / f"{self.name}-beat-schedule")] if beat else [])],
        )  # fmt: skip

    def start_beat(self) -> None:
        self.spawn(
            "beat",
            ["celery", "-A", "config", "beat", "--loglevel", "INFO",
             "-s", str(self.tmp / f"{self.name}-beat-schedule")],
        )  # fmt: skip

    def _alive(self, what: str) -> None:
        proc = self.procs[what]
        if proc.poll() is not None:
            raise AssertionError(f"{self.name} {what} exited:\n{self.log(what)[-4000:]}")

    def ready(self, what: str) -> bool:
        self._alive(what)
        if what == "web":
            try:
                # Plain HTTP, polled: verify=False spares loading the CA
                # bundle into a TLS context at every call.
                url = f"{self.url}/api/v1/openapi.json"
                return httpx.get(url, timeout=2, verify=False).status_code == 200
            except httpx.HTTPError:
                return False
        if what == "beat":
            return "beat: Starting" in self.log(what)
        if " ready." in self.log(what):
            self.pids[what] = _group_pids(self.procs[what].pid)
            return True
        return False

    def wait_ready(self, *names: str, timeout: float = 180) -> None:
        for what in names:
            wait_for(
                lambda w=what: self.ready(w), timeout=timeout, interval=0.2,
                message=f"{self.name} {what} to be ready",
            )  # fmt: skip

    def stop(self, what: str, sig: int = signal.SIGTERM, timeout: float = 120) -> None:
        """``sig`` to the process, then wait for its whole group to exit."""
        proc = self.procs[what]
        if what == "worker":  # the pool's pids, for the turns' starters
            self.pids[what] = self.pids.get(what, set()) | _group_pids(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        proc.wait(timeout=timeout)
        wait_for(
            lambda: not _group_pids(proc.pid), timeout=30, interval=0.2,
            message=f"{self.name} {what}'s processes to exit",
        )  # fmt: skip

    def kill_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(timeout=20)

    def logs(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace") for p in self.tmp.glob(f"{self.name}-*.log")}


class Admissions:
    """Steady admissions over HTTP: threads, each admission with its own
    dedupe key, sent to the webs in ``targets`` in turn (the load balancer);
    a transport error is retried with the same key, as a client would."""

    def __init__(self, key: str, threads: int = 3, pause_s: float = 0.1):
        self.key, self.threads, self.pause_s = key, threads, pause_s
        self.targets: list[str] = []
        self.results: list[dict] = []
        self._n = itertools.count()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _one(self, clients: dict[str, httpx.Client], i: int) -> dict:
        body = {
            "endpoint": LOAD_ENDPOINTS[i % len(LOAD_ENDPOINTS)],
            "input": {"seconds": 0.1},
            "dedupe_key": f"rolling-{i}",
        }
        retried: list[str] = []
        while True:
            # Each try picks from the current rotation: a web taken out of it
            # while this request was on its way is not asked again.
            targets = self.targets
            target = targets[(i + len(retried)) % len(targets)]
            client = clients.get(target)
            if client is None:
                client = clients[target] = httpx.Client(
                    base_url=target, timeout=30, headers={"Authorization": f"Bearer {self.key}"}
                )
            sent = time.monotonic()
            try:
                resp = client.post("/api/v1/tickets", json=body)
            except httpx.HTTPError as exc:
                if len(retried) < 3:
                    retried.append(f"{target}: {exc!r}")
                    continue
                return {"status": "error", "web": target, "at": sent, "ticket": None,
                        "retried": retried, "body": repr(exc)}  # fmt: skip
            is_json = resp.headers.get("content-type", "").startswith("application/json")
            data = resp.json() if is_json else {}
            ok = resp.status_code in (200, 201)
            return {
                "status": resp.status_code, "web": target, "at": sent, "retried": retried,
                "ticket": data.get("id") if ok else None, "body": "" if ok else resp.text[:300],
            }  # fmt: skip

    def _run(self) -> None:
        clients: dict[str, httpx.Client] = {}
        try:
            while not self._stop.is_set():
                result = self._one(clients, next(self._n))
                with self._lock:
                    self.results.append(result)
                self._stop.wait(self.pause_s)
        finally:
            for client in clients.values():
                client.close()

    def start(self, targets: list[str]) -> None:
        self.targets = list(targets)
        for _ in range(self.threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)

    def route(self, targets: list[str]) -> None:
        self.targets = list(targets)  # one assignment: the threads read it whole

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)

    def count(self, web: str | None = None, since: float = 0.0) -> int:
        with self._lock:
            return sum(
                1
                for r in self.results
                if r["status"] in (200, 201)
                and r["at"] >= since
                and (web is None or r["web"] == web)
            )

    def wait(self, n: int, *, web: str | None = None, since: float = 0.0, timeout: float = 60):
        wait_for(
            lambda: self.count(web, since) >= n, timeout=timeout, interval=0.1,
            message=f"{n} admissions{' through ' + web if web else ''}",
        )  # fmt: skip


class Ledger:
    """The scratch database, read directly (owner, autocommit)."""

    def __init__(self, database: str):
        self.url = _url(database)

    def rows(self, query: str, params=None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()

    def state(self, ticket: str) -> str:
        return self.rows("SELECT state FROM tickets_ticket WHERE id = %s", [ticket])[0][0]

    def wait_state(self, ticket: str, states: tuple[str, ...], what: str, timeout: float = 120):
        wait_for(
            lambda: self.state(ticket) in states, timeout=timeout, interval=0.2,
            message=f"{what} to be {'|'.join(states)} (is {self.state(ticket)})",
        )  # fmt: skip


def _post(client: httpx.Client, path: str, body: dict, expect=(200, 201)) -> dict:
    resp = client.post(path, json=body)
    assert resp.status_code in expect, f"POST {path}: {resp.status_code} {resp.text[:500]}"
    return resp.json()


SQL_FUNCTION_FAILURE = re.compile(
    r"function \S+ does not exist|UndefinedFunction|Traceback \(most recent call last\)"
)


def test_a_rolling_upgrade_from_the_previous_release(scratch, tmp_path):  # noqa: F811
    version, commit = previous_release()
    old_tree = _export(commit, tmp_path / f"release-{version}")
    database = scratch()
    redis = PrivateRedis()
    redis.start()
    old = Release("old", old_tree, database, redis, tmp_path)
    new = Release("new", ROOT, database, redis, tmp_path)
    ledger = Ledger(database)
    load: Admissions | None = None
    try:
        # --- The previous release: migrated, seeded, serving. ---
        _migrate(old_tree, database)
        seeded = old.manage("seed_demo", "--allow-production")
        key = re.search(r"^API key: (\S+)$", seeded, re.M).group(1)
        old.start_web()
        old.start_worker("turns,control", beat=True)
        old.wait_ready("web", "worker")
        api = httpx.Client(base_url=old.url, timeout=30, headers={"Authorization": f"Bearer {key}"})
        runner = {"kind": "python", "path": "upgrade_runner.work", "isolation": "inline"}
        for address in [*LOAD_ENDPOINTS, "park.child"]:
            _post(api, "/api/v1/endpoints", {"address": address, "runner": runner})
        for address in ("hold.done", "hold.cut"):
            _post(
                api,
                "/api/v1/endpoints",
                {"address": address, "runner": runner, "turn_budget_s": 600},
            )
        # Children queue behind a pause until the new release runs them.
        _post(api, "/api/v1/endpoints/park.child/pause", {"reason": "parked across the upgrade"})

        # Two turns held open on the old worker across the migrate and the new
        # release's start: one let go before the drain (it finishes on the
        # new schema), one still running when the old worker is told to stop
        # (its warm shutdown interrupts it and records the stop: design.md,
        # "Worker shutdown").
        held = {
            address: _post(
                api, "/api/v1/tickets",
                {"endpoint": address, "input": {"gate": str(tmp_path / address)}},
            )["id"]
            for address in ("hold.done", "hold.cut")
        }  # fmt: skip
        for ticket in held.values():
            ledger.wait_state(ticket, ("running",), "a held turn")
        # A ticket waiting on its children, an agent exchange waiting on an owner.
        parked_input = {"children": 2, "child_endpoint": "park.child", "child_input": {}}
        research = _post(
            api, "/api/v1/tickets", {"endpoint": "demo.research", "input": parked_input}
        )
        asking = _post(
            api, "/api/v1/tickets", {"endpoint": "demo.agent", "input": {"prompt": "send ops"}}
        )
        ledger.wait_state(research["id"], ("waiting",), "the research ticket")
        ledger.wait_state(asking["id"], ("waiting",), "the agent exchange", timeout=180)
        api.close()

        load = Admissions(key)
        load.start([old.url])
        load.wait(10, web=old.url)

        # --- 1. This tree's migrate, while the old release serves. ---
        _migrate(ROOT, database)
        migrated_at = time.monotonic()
        (migrated_db,) = ledger.rows("SELECT now()")[0]
        # The old release goes on admitting and running on the new schema.
        load.wait(5, web=old.url, since=migrated_at)
        wait_for(
            lambda: _no_function_failures(tmp_path, old, new)
            and ledger.rows(
                "SELECT count(*) FROM runtime_turn WHERE started_at > %s AND state = 'completed'",
                [migrated_db],
            )[0][0] >= 3,
            timeout=60, message="the old worker to finish turns on the new schema",
        )  # fmt: skip

        # --- 2. This tree's web and worker beside the old ones. ---
        new.start_web()
        new.start_worker("turns,control", beat=False)
        new.wait_ready("web", "worker")
        both_at = time.monotonic()
        load.route([old.url, new.url])
        load.wait(5, web=new.url, since=both_at)
        load.wait(5, web=old.url, since=both_at)
        (tmp_path / "hold.done").touch()
        ledger.wait_state(held["hold.done"], TERMINAL, "the turn let go")

        # --- 3. The old processes drain and stop. ---
        load.route([new.url])  # out of the balancer first, then stopped
        old.stop("web")
        assert ledger.state(held["hold.cut"]) == "running"
        old_worker = old.procs["worker"]
        os.kill(old_worker.pid, signal.SIGTERM)  # warm shutdown, as systemd sends it
        wait_for(
            lambda: "worker: Warm shutdown" in old.log("worker") or old_worker.poll() is not None,
            timeout=60, message="the old worker's warm shutdown",
        )  # fmt: skip
        old.stop("worker", sig=0)  # already signalled: wait for it
        # The new release's beat, and its post-deploy step, once no process of
        # the old release runs (beat's start-up and post_deploy side by side).
        new.start_beat()
        new.manage("post_deploy", owner=True)
        new.wait_ready("beat")

        # The parked work resumes under the new release.
        api = httpx.Client(base_url=new.url, timeout=30, headers={"Authorization": f"Bearer {key}"})
        _post(api, "/api/v1/endpoints/park.child/resume", {"reason": "upgraded"})
        calls = api.get("/api/v1/endpoints/demo.agent/approvals").json()
        assert [c["ticket"] for c in calls] == [asking["id"]], calls
        _post(
            api, f"/api/v1/endpoints/demo.agent/approvals/{asking['id']}/{calls[0]['call_id']}",
            {"approve": True, "reason": "approved after the upgrade"},
        )  # fmt: skip
        api.close()
        load.wait(10, since=time.monotonic())
        load.stop()

        # --- Every acknowledged admission exists and settles. ---
        acked = {r["ticket"] for r in load.results if r["ticket"]}
        parked = {*held.values(), research["id"], asking["id"]}

        def settled():
            rows = dict(
                ledger.rows(
                    "SELECT id::text, state FROM tickets_ticket WHERE id = ANY(%s)",
                    [list(acked | parked)],
                )
            )
            return (
                rows
                if len(rows) == len(acked | parked) and all(s in TERMINAL for s in rows.values())
                else None
            )

        wait_for(settled, timeout=180, interval=0.5, message="every ticket to settle")
        states = settled()
        statuses = Counter(str(r["status"]) for r in load.results)
        assert set(statuses) <= {"200", "201"}, (
            statuses, [r for r in load.results if r["status"] not in (200, 201)][:5],
        )  # fmt: skip

        # --- Every turn finished by the release that started it: completed
        # by its process, or (still running when the old worker was told to
        # stop) stopped by the old worker's shutdown, its ticket failed
        # `interrupted`. None left to the new release's sweeps, none run twice.
        pool = {"old": old.pids["worker"], "new": _group_pids(new.procs["worker"].pid)}
        turns = ledger.rows(
            "SELECT t.id::text, t.state, (t.worker->>'pid')::int, t.interrupt_reason, "
            "t.stop_evidence IS NOT NULL, tk.id::text, tk.state, tk.error->>'code', tk.result, "
            "e.address FROM runtime_turn t JOIN tickets_ticket tk ON tk.id = t.ticket_id "
            "JOIN endpoints_endpoint e ON e.id = t.endpoint_id"
        )
        by_release: Counter = Counter()
        cut: dict[str, str] = {}
        for (
            turn,
            state,
            pid,
            reason,
            evidence,
            ticket,
            ticket_state,
            code,
            result,
            address,
        ) in turns:
            (started_by,) = [name for name, pids in pool.items() if pid in pids] or [None]
            assert started_by, (turn, pid, address, pool)
            by_release[started_by] += 1
            if state == "stopped":
                assert (started_by, reason, evidence) == ("old", "shutdown", True), turns
                assert (ticket_state, code) == ("failed", "interrupted"), (
                    ticket,
                    ticket_state,
                    code,
                )
                cut[ticket] = address
                continue
            assert state == "completed", (turn, state, address)
            if isinstance(result, dict) and "release" in result:
                assert result["release"] == started_by, (turn, address, result, started_by)
        assert cut.get(held["hold.cut"]) == "hold.cut", cut
        done = ledger.rows("SELECT result FROM tickets_ticket WHERE id = %s", [held["hold.done"]])
        assert done[0][0]["release"] == "old" and done[0][0]["gate_open"], done
        assert by_release["old"] and by_release["new"], by_release
        replays = ledger.rows(
            "SELECT ticket_id FROM runtime_turn GROUP BY ticket_id HAVING count(*) > 1"
        )
        assert not replays, replays
        others = Counter(s for t, s in states.items() if t not in cut)
        assert others == {"succeeded": len(states) - len(cut)}, (
            others,
            ledger.rows(
                "SELECT tk.id, e.address, tk.state, tk.error, (SELECT array_agg(ev.kind "
                "ORDER BY ev.id) FROM tickets_ticketevent_all ev WHERE ev.ticket_id = tk.id) "
                "FROM tickets_ticket tk JOIN endpoints_endpoint e ON e.id = tk.endpoint_id "
                "WHERE tk.state <> 'succeeded' AND NOT tk.id::text = ANY(%s)",
                [list(cut)],
            ),
        )
        unsettled = ledger.rows(
            "SELECT id, state FROM tickets_ticket WHERE state <> ALL(%s)", [list(TERMINAL)]
        )
        assert not unsettled, unsettled

        # The parked work completed under the new release.
        children = ledger.rows(
            "SELECT result FROM tickets_ticket WHERE parent_id = %s", [research["id"]]
        )
        assert [r["release"] for (r,) in children] == ["new", "new"], children
        (asked,) = ledger.rows("SELECT result FROM tickets_ticket WHERE id = %s", [asking["id"]])[0]
        assert asked.startswith("done: send_report: sent to ops"), asked

        # --- No process met a missing function, nor any traceback. ---
        _no_function_failures(tmp_path, old, new)
        # Every request either web answered (the test's own calls too), from
        # gunicorn's access log: none with a 5xx.
        served = old.log("web") + new.log("web")
        assert not re.findall(r'HTTP/1\.[01]" 5\d\d ', served), re.findall(
            r".*\" 5\d\d .*", served
        )[:5]

        # --- The ledger's audit, with this tree. ---
        audit = subprocess.run(
            [sys.executable, "manage.py", "audit_ledger", "--json"], cwd=ROOT, env=new.env,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert audit.returncode == 0, audit.stdout[-4000:] + audit.stderr[-2000:]
        print(
            "ROLLING-UPGRADE-FIGURES",
            json.dumps(
                {
                    "from": version,
                    "admissions": len(load.results),
                    "per_s": round(
                        len(load.results)
                        / max(load.results[-1]["at"] - load.results[0]["at"], 1e-3),
                        1,
                    ),
                    "responses": dict(statuses),
                    "by_web": dict(
                        Counter("old" if r["web"] == old.url else "new" for r in load.results)
                    ),
                    "turns_by_release": dict(by_release),
                    "interrupted_by_shutdown": len(cut),
                    "retried_transport_errors": [e for r in load.results for e in r["retried"]],
                }
            ),
        )
    finally:
        if load is not None:
            load.stop()
        new.kill_all()
        old.kill_all()
        redis.destroy()
        if os.environ.get("ROLLING_UPGRADE_KEEP_LOGS"):
            shutil.copytree(
                tmp_path,
                os.environ["ROLLING_UPGRADE_KEEP_LOGS"],
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(f"release-{version}"),
            )


def _no_function_failures(tmp: Path, *releases: Release) -> bool:
    """True, or an AssertionError naming each process log that shows a
    missing function or a traceback, with the text around the first."""
    failures = {
        name: [m.group(0) for m in SQL_FUNCTION_FAILURE.finditer(text)]
        for release in releases
        for name, text in release.logs().items()
    }
    failures = {name: found for name, found in failures.items() if found}
    assert not failures, {
        name: (found[:3], _context(tmp / name, found[0])) for name, found in failures.items()
    }
    return True


def _context(path: Path, needle: str, around: int = 1500) -> str:
    text = path.read_text(errors="replace")
    at = text.find(needle)
    return text[max(0, at - around) : at + around]
