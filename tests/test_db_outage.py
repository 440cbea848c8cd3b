"""A PostgreSQL restart under real processes (issue 9, findings 2, 6, 7).

A private cluster (tests/faults/cluster.py) that these tests stop and start; real
Celery workers and beat, and the web app under gunicorn, all pointed at it;
the machine's Redis (the test broker). Nothing is restarted but PostgreSQL.

- A turn whose finish meets the outage completes ``succeeded`` once the
  database is back: no quarantine, one ``turn_started``, one terminal event.
- While PostgreSQL is down the API answers 503 ``unavailable`` with
  Retry-After and the console a small 503 page; both recover by themselves.
- /readyz names the sweeps that do not run (no beat, no control worker) and
  is 200 once they do; a control worker outlives the outage.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from core.sweeps import SWEEP_TASKS
from tests.conftest import Processes, purge_broker, wait_for
from tests.faults.cluster import PrivatePostgres, available

pytestmark = [
    pytest.mark.integration,
    # A private cluster, its migration and gunicorn before the first test:
    # minutes on a loaded machine, past the suite's 300 s per test.
    pytest.mark.timeout(900),
    pytest.mark.skipif(not available(), reason="PostgreSQL server binaries needed"),
]

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"succeeded", "failed", "cancelled", "recovering", "orphaned"}


@dataclass
class Stack:
    pg: PrivatePostgres
    env: dict[str, str]
    key: str  # a staff API key
    base: str = ""

    clients: list[httpx.Client] | None = None
    web_log: Path | None = None

    def client(self, path: str = "", **kw) -> httpx.Client:
        c = httpx.Client(base_url=f"{self.base}{path}", timeout=30, **kw)
        self.clients.append(c)
        return c

    def api(self) -> httpx.Client:
        return self.client("/api/v1", headers={"Authorization": f"Bearer {self.key}"})

    def close_clients(self) -> None:
        while self.clients:
            self.clients.pop().close()


# migrate, seed_demo, then create_api_key, whose key is the last line out.
_SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--no-input", verbosity=0)
call_command("seed_demo", "--allow-production")
call_command("create_api_key", "ops", "--staff")
"""


def _setup(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SETUP],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The private cluster, migrated and seeded, and the web app on it."""
    tmp = tmp_path_factory.mktemp("outage")
    with PrivatePostgres() as pg:
        pg.init().start()
        url = pg.createdb("claimcheck")
        env = {
            "DATABASE_URL": url,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CLAIMCHECK_VAR_DIR": str(tmp / "var"),
            "SWEEP_INTERVAL_S": "0.5",
            "OBLIGATION_SWEEP_INTERVAL_S": "1",
            "REDISPATCH_AFTER_S": "1",
            # Persistent connections, as in production: they must survive a restart.
            "DB_CONN_MAX_AGE": "60",
            "DB_CONNECT_TIMEOUT_S": "2",
            # The private cluster has one role (its superuser): not `make test`'s two.
            "DATABASE_APP_ROLE": "",
            "DATABASE_MIGRATE_URL": "",
        }
        # The three steps in one interpreter (Django's start costs seconds).
        key = _setup(env).strip().splitlines()[-1]
        stack = Stack(pg=pg, env=env, key=key, clients=[], web_log=tmp / "web.log")
        port = _free_port()
        with open(tmp / "web.log", "ab") as log:
            web = subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}",
                    "-w", "1", "--threads", "4", "--timeout", "60",
                ],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        stack.base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _status(f"{stack.base}/login/") == 200, timeout=90, message="web")
            yield stack
        finally:
            stack.close_clients()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=20)


@pytest.fixture(scope="module")
def _kept(stack, tmp_path_factory):
    """The ``outage_worker`` kept from one test to the next that asks for it."""
    kept = Processes(tmp_path_factory.mktemp("outage-worker"), env=stack.env)
    yield kept
    kept.stop_all()


@pytest.fixture
def procs(request, stack, tmp_path, _kept):
    if "outage_worker" not in request.fixturenames:
        _kept.stop_all()  # this test expects no worker but its own
    purge_broker()
    p = Processes(tmp_path, env=stack.env)
    yield p
    p.stop_all()
    stack.close_clients()


@pytest.fixture
def outage_worker(request, procs, _kept):
    """A worker on both queues with beat embedded, as two tests here need it
    unconfigured: started by the first, kept for the next (one start fewer),
    killed after a test that failed or before a test that does not ask for
    it. Its log from this test on is the test's."""
    if not _kept.alive("turns"):
        _kept.worker(
            queues="turns,control", concurrency=2, ready_timeout=READY_S, embedded_beat=True
        )
    _kept.log_start["turns"] = 0
    _kept.log_start["turns"] = len(_kept.log("turns"))
    yield _kept
    report = getattr(request.node, "rep_call", None)
    if report is None or report.failed:
        _kept.stop_all()


# Python and Django start slowly on a loaded 2-core machine.
READY_S = 120


def _get(url: str, **kw) -> httpx.Response:
    # Plain HTTP, polled: verify=False spares loading the CA bundle into a
    # TLS context at every call (most of a poll's CPU).
    return httpx.get(url, timeout=10, verify=False, **kw)


def _status(url: str, **kw) -> int | None:
    try:
        return _get(url, **kw).status_code
    except httpx.HTTPError:
        return None


def _ticket_state(api: httpx.Client, ticket_id: str) -> str | None:
    r = api.get(f"/tickets/{ticket_id}")
    return r.json()["state"] if r.status_code == 200 else None


def _console_session(stack: Stack) -> httpx.Client:
    """Logged in as the demo owner through the real login form."""
    s = stack.client()
    s.get("/login/")
    r = s.post(
        "/login/",
        data={
            "username": "demo",
            "password": "demo-owner",
            "csrfmiddlewaretoken": s.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.base}/login/"},
    )
    assert r.status_code == 302, r.text[:300]
    return s


def test_a_finish_that_meets_a_postgres_restart_completes_once(stack, outage_worker):
    procs = outage_worker
    api = stack.api()
    # An outage shorter than heartbeat timeout + grace must never quarantine.
    r = api.patch("/endpoints/demo.sleep", json={"heartbeat_timeout_s": 15, "interrupt_grace_s": 3})
    assert r.status_code == 200, r.text
    ticket = api.post("/tickets", json={"endpoint": "demo.sleep", "input": {"seconds": 3}}).json()
    wait_for(lambda: _ticket_state(api, ticket["id"]) == "running", message="the turn to start")
    # The runner itself must be running when the database stops: between the
    # start and the fork the supervisor reads the endpoint's history, and a
    # read that meets the outage waits it out (the runner would then start
    # after it, and no finish would meet it).
    wait_for(
        lambda: b"runs in process" in procs.log("turns"), message="the runner's process to start"
    )

    stack.pg.stop()  # "terminating connection due to administrator command"
    outage = time.monotonic()
    try:
        # Keep it down until the runner has returned and its finish met the
        # outage: retried (WARNING "finish of turn ...") or, before the fix,
        # lost with the task ("raised unexpected: OperationalError").
        wait_for(
            lambda: any(
                b"finish of turn" in line
                or (b"run_ticket" in line and b"raised unexpected" in line)
                for line in procs.log("turns").splitlines()
            ),
            timeout=30,
            message="the finish to meet the outage",
        )
    finally:
        stack.pg.start()
    outage = time.monotonic() - outage

    state = wait_for(
        lambda: (s := _ticket_state(api, ticket["id"])) in TERMINAL and s,
        timeout=60,
        message="the ticket to end",
    )
    assert state == "succeeded", (
        f"after a {outage:.1f}s outage the ticket is {state}; the turns worker's log:\n"
        + procs.log("turns")[-6000:].decode(errors="replace")
    )
    assert b"transient database error" in procs.log("turns")  # the finish was retried
    body = api.get(f"/tickets/{ticket['id']}").json()
    assert body["result"]["slept_s"] >= 3
    kinds = [e["kind"] for e in api.get(f"/tickets/{ticket['id']}/events").json()]
    assert kinds.count("turn_started") == 1 and kinds.count("turn_completed") == 1, kinds
    assert "stale_outcome" not in kinds and "interrupt_requested" not in kinds, kinds
    endpoint = api.get("/endpoints/demo.sleep").json()
    assert endpoint["state"] == "available" and endpoint["open_case"] is None
    assert endpoint["lock"]["holder_turn"] is None
    assert api.get("/recovery/cases").json() == [] or all(
        c["endpoint"] != "demo.sleep" for c in api.get("/recovery/cases").json()
    )
    # The endpoint works on: the next ticket runs at once.
    nxt = api.post("/tickets", json={"endpoint": "demo.echo", "input": {"after": "outage"}})
    assert nxt.status_code == 201
    wait_for(lambda: _ticket_state(api, nxt.json()["id"]) == "succeeded", timeout=30)


OUTAGE_S = 10


def _outage_lines(log: bytes) -> dict[str, int]:
    lines = log.decode(errors="replace").splitlines()
    # WARNING lines per (second, logger, cause): the cause is the message
    # up to its first ": " (what failed), the error's text after it.
    per_cause: dict[tuple[str, str, str], int] = {}
    for line in lines:
        parts = line.split(" ", 4)
        if len(parts) == 5 and parts[2] == "WARNING":
            key = (parts[1][:8], parts[3], parts[4].split(": ", 1)[0])
            per_cause[key] = per_cause.get(key, 0) + 1
    return {
        "error": sum(" ERROR " in line for line in lines),
        "warning": sum(" WARNING " in line for line in lines),
        "traceback": sum(line.startswith("Traceback") for line in lines),
        "most_per_cause_per_second": max(per_cause.values(), default=0),
    }


# Right after the test above, which starts the ``outage_worker`` this one keeps.
def test_an_outage_logs_a_warning_per_cause_per_second_and_no_traceback(stack, outage_worker):
    """While PostgreSQL is down the worker and the web app each say so once
    a second per cause, at WARNING: no traceback per retry, no ERROR line
    (alerting is for what an outage does not explain)."""
    procs = outage_worker
    api = stack.api()
    assert api.get("/endpoints/demo.echo").status_code == 200
    before = len(procs.log("turns"))
    web_before = stack.web_log.stat().st_size
    stack.pg.stop()
    began = time.monotonic()
    try:
        # The outage itself, of a fixed length, the web app asked once a second.
        def outage_over() -> bool:
            assert api.get("/endpoints/demo.echo").status_code == 503
            return time.monotonic() - began >= OUTAGE_S

        wait_for(outage_over, timeout=OUTAGE_S + 10, interval=1.0)
    finally:
        stack.pg.start()
    wait_for(lambda: api.get("/endpoints/demo.echo").status_code == 200, timeout=30)
    worker = _outage_lines(procs.log("turns")[before:])
    web = _outage_lines(stack.web_log.read_bytes()[web_before:])
    print(f"outage {OUTAGE_S} s: turns worker {worker}, web {web}")
    assert worker["traceback"] == 0, procs.log("turns")[-6000:].decode(errors="replace")
    assert worker["error"] == 0, procs.log("turns")[-6000:].decode(errors="replace")
    # Each process keeps its own count (as the web's 503 line does): the two
    # pool processes may both run a sweep of one kind within a second here
    # (SWEEP_INTERVAL_S is 0.5 s).
    assert worker["most_per_cause_per_second"] <= 2, worker
    assert web["traceback"] == 0 and web["error"] == 0, web


def test_the_api_answers_503_while_postgres_is_down_and_recovers(stack, procs):
    api = stack.api()
    console = _console_session(stack)
    assert api.get("/endpoints/demo.echo").status_code == 200  # a warm, persistent connection
    assert console.get("/").status_code == 200

    stack.pg.stop()
    try:
        statuses = []
        for call in (
            lambda: api.get("/endpoints/demo.echo"),
            lambda: api.get("/tickets"),
            lambda: api.post("/tickets", json={"endpoint": "demo.echo", "input": {}}),
        ):
            r = call()
            statuses.append(r.status_code)
            assert r.status_code == 503, r.text[:300]
            assert r.headers["content-type"].startswith("application/json")
            assert r.json()["error"] == "unavailable" and int(r.headers["retry-after"]) >= 1
        page = console.get("/")
        assert page.status_code == 503 and int(page.headers["retry-after"]) >= 1
        assert "database is briefly unavailable" in page.text and "Traceback" not in page.text
        assert _status(f"{stack.base}/healthz") == 200  # alive, only not ready
        ready = _get(f"{stack.base}/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["failed"]
    finally:
        stack.pg.start()

    # No restart of the web app: the next requests reconnect.
    wait_for(
        lambda: api.get("/endpoints/demo.echo").status_code == 200,
        timeout=30,
        message="the API to answer again",
    )
    assert console.get("/").status_code == 200  # the session outlived the outage
    assert 500 not in statuses


def test_a_committed_admission_whose_wait_meets_an_outage_answers_201(stack, procs):
    """Once an admission committed its answer is 201 with the ticket as it
    stands: PostgreSQL stopping during its ``wait_s`` (the listener's
    connection lost, the re-read refused) is no 503."""
    import threading
    import uuid

    import psycopg

    api = stack.api()
    key = f"truth-{uuid.uuid4().hex}"
    answer: dict[str, object] = {}

    def admit() -> None:
        started = time.monotonic()
        answer["response"] = api.post(
            "/tickets",
            json={"endpoint": "demo.echo", "input": {"k": key}, "dedupe_key": key, "wait_s": 40},
        )
        answer["took_s"] = time.monotonic() - started

    def committed_and_waiting() -> bool:
        # No worker runs: the ticket stays queued and the request waits on
        # (the web process's listener holds a LISTEN session meanwhile).
        with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
            admitted = conn.execute(
                "SELECT 1 FROM tickets_ticket WHERE dedupe_key = %s", [key]
            ).fetchone()
            listening = conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
            ).fetchone()
        return bool(admitted and listening)

    thread = threading.Thread(target=admit, daemon=True)
    thread.start()
    try:
        wait_for(committed_and_waiting, timeout=30, message="the admission to commit and wait")
        stack.pg.stop()
        thread.join(timeout=30)
    finally:
        stack.pg.start()
    assert not thread.is_alive(), "the admission did not answer during the outage"
    response = answer["response"]
    assert response.status_code == 201, response.text[:300]
    body = response.json()
    assert body["state"] == "queued" and body["dedupe_key"] == key
    assert answer["took_s"] < 35  # answered when the wait failed, not at its end
    # The same key afterwards finds that very ticket.
    again = wait_for(
        lambda: (
            (
                r := api.post(
                    "/tickets",
                    json={"endpoint": "demo.echo", "input": {"k": key}, "dedupe_key": key},
                )
            ).status_code
            != 503
            and r
        ),
        timeout=30,
        message="the API to answer again",
    )
    assert again.status_code == 200 and again.json()["id"] == body["id"], again.text[:300]


def test_readyz_reports_a_missing_sweeper_until_beat_runs(stack, procs):
    readyz = f"{stack.base}/readyz"
    # Every sweep beat runs (a new one is named here by itself).
    sweeps = {f"sweep:{name}" for name in SWEEP_TASKS}

    def failed() -> set[str] | None:
        r = _get(readyz)
        return set(r.json()["failed"]) if r.status_code in (200, 503) else None

    # A turns worker, but neither beat nor a control worker.
    procs.worker(name="turns", queues="turns", ready_timeout=READY_S)
    wait_for(lambda: failed() == sweeps, timeout=30, message="readyz to name every sweep")
    console = _console_session(stack)
    assert "Sweeper not running" in console.get("/").text

    procs.worker(name="control", queues="control", ready_timeout=READY_S)
    procs.beat(ready_timeout=READY_S)
    wait_for(lambda: failed() == set(), timeout=60, message="readyz to be 200")
    assert _get(readyz).status_code == 200
    assert "Sweeper not running" not in console.get("/").text

    # An outage: the control worker's sweeps fail, the worker lives on, and
    # the sweeps resume without restarting anything.
    stack.pg.stop()
    try:
        wait_for(
            lambda: b"skipped" in procs.log("control"),
            timeout=30,
            message="a sweep to meet the outage",
        )
    finally:
        # Taken while the database is still down: any sweep finished after
        # this moment ran once it was back (start() returns a moment after
        # the server accepts connections, and a sweep may finish in between).
        restarted_at = time.time()
        stack.pg.start()
    wait_for(lambda: failed() == set(), timeout=60, message="readyz to be 200 again")
    from datetime import datetime

    def budgets_swept_since_restart() -> bool:
        # readyz may be 200 at once on a sweep from before the outage (still
        # fresh); what must follow is a sweep that ran once the database was back.
        checks = _get(readyz).json()["checks"]
        finished = checks["sweep:budgets"]["last_finished_at"]
        return bool(finished) and datetime.fromisoformat(finished).timestamp() > restarted_at

    wait_for(budgets_swept_since_restart, timeout=30, message="a budget sweep after the outage")
    assert procs.procs["control"].poll() is None

    procs.kill("beat")
    wait_for(
        lambda: sweeps <= (failed() or set()),
        timeout=30,
        message="readyz to notice that beat is gone",
    )
