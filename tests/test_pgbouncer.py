"""The topology docs/howto/deploy.md recommends, run: PgBouncer in transaction mode
in front of the web (gunicorn with deploy/gunicorn.conf.py) and a turns
worker; the control worker and beat connect directly; the LISTEN sessions
(the web's ticket waits, every worker's dispatcher) connect directly through
DATABASE_LISTEN_URL. Prepared statements are off, as PgBouncer 1.18 needs.

What it shows: ``wait_s`` answers within a second of the ticket's terminal
transition (through the pooler alone, the web's LISTEN lands on a server
connection that other clients then use, nothing wakes it, and the request
waits its full ``wait_s``); dispatch latency through the pooler within a
quarter second of a turns worker connected directly (both measured here,
the same endpoint, one worker consuming at a time: a pooler hop costs well
under a millisecond, while a connection per transaction or a missed wake-up
costs hundreds; a ratio of two medians of tens of milliseconds failed on a
loaded machine); a console live-region watch wakes on a
change; the sweeps run and leave no advisory lock behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from tests.conftest import ROOT, Processes, _test_env, purge_broker, wait_for
from tests.faults.cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
WAIT_S = 8  # what a waiting request asks for: through a broken LISTEN it waits all of it
ROUNDS = 8  # admissions per worker
BLOCK = 4  # admissions in a row to one worker


@pytest.fixture
def pgbouncer():
    """PgBouncer (Debian's package; `make test` installs it) in transaction
    mode on a free port, in front of the test database."""
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed (`make pgbouncer`)")
    db = settings.DATABASES["default"]
    name = connection.settings_dict["NAME"]
    port = free_port()
    conf = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    (conf / "users.txt").write_text(f'"{db["USER"]}" ""\n')
    (conf / "pgbouncer.ini").write_text(
        f"""[databases]
{name} = host={db["HOST"] or "127.0.0.1"} port={db["PORT"] or 5432} dbname={name}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {conf / "users.txt"}
pool_mode = transaction
default_pool_size = 8
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
"""
    )
    # PgBouncer refuses to run as root: it reads its files, then drops to nobody.
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    with open(conf / "pgbouncer.log", "wb") as log:
        proc = subprocess.Popen(
            [PGBOUNCER, *user, str(conf / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
        )

    def accepting() -> bool:
        assert proc.poll() is None, (conf / "pgbouncer.log").read_text()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        return False

    wait_for(accepting, timeout=10, message="pgbouncer to listen")
    yield f"postgres://{db['USER']}@127.0.0.1:{port}/{name}"
    proc.terminate()
    proc.wait(timeout=10)
    shutil.rmtree(conf, ignore_errors=True)


class Web:
    """gunicorn as deploy/gunicorn.conf.py runs it (one process, 4 threads)."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "web.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "config.wsgi:application",
                 "-c", "deploy/gunicorn.conf.py"],
                cwd=ROOT,
                env={**env, "GUNICORN_BIND": f"127.0.0.1:{self.port}", "WEB_CONCURRENCY": "1",
                     "GUNICORN_THREADS": "4", "GUNICORN_ACCESS_LOG": "-"},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            # Plain HTTP, polled: verify=False spares loading the CA bundle
            # into a TLS context at every call (most of a poll's CPU).
            return httpx.get(f"{self.url}/healthz", timeout=2, verify=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _start_worker(procs: Processes, name: str, queues: str, *extra: str) -> None:
    procs.start(
        name, "worker", "-Q", queues, "-c", "1", "-n", f"{name}@%h",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO", *extra,
    )  # fmt: skip


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _sql(query: str, params=None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def test_recommended_topology_behind_pgbouncer_in_transaction_mode(
    pgbouncer, tmp_path, make_endpoint, api_key, staff_user
):
    direct = _test_env()["DATABASE_URL"]
    common = {
        "DATABASE_LISTEN_URL": direct,
        "DB_CONN_MAX_AGE": "60",
        "CONSOLE_LIVE_WAIT_S": str(WAIT_S),
    }
    # Behind PgBouncer 1.18 in transaction mode, as docs/howto/deploy.md says: the
    # functions' calls are unnamed statements (the suite's own are prepared).
    pooled_env = {**common, "DATABASE_URL": pgbouncer, "DATABASE_PREPARED_CALLS": "0"}
    purge_broker()
    pooled = Processes(tmp_path, pooled_env)
    directly = Processes(tmp_path, {**common, "DATABASE_URL": direct})
    web = Web(tmp_path, {**_test_env(), **pooled_env})
    http = httpx.Client(
        base_url=web.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    )
    try:
        # All at once (starting Python is the slow part). The direct turns
        # worker consumes a queue nobody publishes to until its turn comes.
        _start_worker(pooled, "turns-pooled", "turns")
        _start_worker(directly, "turns-direct", "parked")
        _start_worker(directly, "control", "control", "-B", "-s", str(tmp_path / "beat"))
        for name, procs in (("turns-pooled", pooled), ("turns-direct", directly)):
            wait_for(lambda p=procs, n=name: b"ready." in p.log(n), timeout=90, message=name)
        wait_for(lambda: b"beat: Starting" in directly.log("control"), timeout=90, message="beat")
        wait_for(web.ready, timeout=90, message="gunicorn")

        make_endpoint("pool.sleep", path="runtime.demo.sleep", isolation="inline")

        from config.celery import app

        host = socket.gethostname()
        main = {
            "pooled": pooled.procs["turns-pooled"].pid,
            "direct": directly.procs["turns-direct"].pid,
        }
        node = {"pooled": f"turns-pooled@{host}", "direct": f"turns-direct@{host}"}
        consuming = "pooled"

        def switch_to(label: str) -> None:
            """Only ``label``'s worker consumes the turns queue from now on."""
            other = "direct" if label == "pooled" else "pooled"
            for how, who in (
                (app.control.add_consumer, label),
                (app.control.cancel_consumer, other),
            ):
                replies = how("turns", destination=[node[who]], reply=True, timeout=10)
                assert replies and node[who] in replies[0], (who, replies)

        # In blocks, alternating, so that both see the same load on a busy
        # machine. The first ticket of a block is not counted: a worker that
        # was just told to consume picks the queue up at its next poll, and
        # a pool process's first turn pays its connection and imports.
        # Each sample is counted for the worker that actually ran it.
        dispatch: dict[str, list[float]] = {"pooled": [], "direct": []}
        late: list[float] = []
        for i in range(2 * ROUNDS):
            want = "pooled" if (i // BLOCK) % 2 == 0 else "direct"
            if want != consuming:
                switch_to(want)
                consuming = want
            resp = http.post(
                "/api/v1/tickets",
                json={"endpoint": "pool.sleep", "input": {"seconds": 0.2},
                      "dedupe_key": f"round-{i}", "wait_s": WAIT_S},
            )  # fmt: skip
            answered = time.time()
            assert resp.status_code == 201, resp.text
            body = resp.json()
            assert body["state"] == "succeeded", body
            ((created, started, finished, pid),) = _sql(
                "SELECT extract(epoch FROM t.created_at), extract(epoch FROM u.started_at), "
                "extract(epoch FROM t.finished_at), (u.worker->>'pid')::int "
                "FROM tickets_ticket t JOIN runtime_turn u ON u.ticket_id = t.id "
                "WHERE t.id = %s",
                [body["id"]],
            )
            ran = next(label for label, parent in main.items() if _parent(pid) == parent)
            if i % BLOCK:
                dispatch[ran].append(float(started) - float(created))
            late.append(answered - float(finished))
        assert all(len(d) >= ROUNDS // 2 for d in dispatch.values()), dispatch

        figures = {
            "dispatch_pooled_median_s": round(statistics.median(dispatch["pooled"]), 4),
            "dispatch_direct_median_s": round(statistics.median(dispatch["direct"]), 4),
            "wait_late_max_s": round(max(late), 3),
        }
        print("PGBOUNCER-FIGURES", figures)
        # wait_s answers at the terminal transition, not at its deadline.
        assert max(late) < 1.0, late
        extra = figures["dispatch_pooled_median_s"] - figures["dispatch_direct_median_s"]
        assert extra < 0.25, figures

        # A console live region: the watch wakes when a ticket changes.
        browser = Client()
        browser.force_login(staff_user)
        cookies = {"sessionid": browser.cookies["sessionid"].value}
        first = httpx.get(f"{web.url}/live/", params={"token": "-"}, cookies=cookies, timeout=30)
        assert first.status_code == 200 and first.json()["live"], first.text
        token = first.json()["token"]

        def listeners() -> int:
            # This test's database only: pg_stat_activity shows the whole cluster's.
            return _sql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'claimcheck waits'"
                " AND datname = current_database()"
            )[0][0]

        # The web's listener closes when nobody waits; the watch opens it
        # again, after subscribing: once it is listening, the watch is in place.
        wait_for(lambda: listeners() == 0, timeout=10, message="the idle listener to close")
        watched: dict = {}

        def watch() -> None:
            watched["resp"] = httpx.get(
                f"{web.url}/live/", params={"token": token}, cookies=cookies, timeout=30
            )
            watched["at"] = time.monotonic()

        waiter = threading.Thread(target=watch)
        waiter.start()
        wait_for(listeners, timeout=10, message="the web's watch to listen")
        changed = time.monotonic()
        resp = http.post(
            "/api/v1/tickets", json={"endpoint": "pool.sleep", "input": {"seconds": 0}}
        )
        assert resp.status_code == 201, resp.text
        waiter.join(timeout=WAIT_S + 5)
        body = watched["resp"].json()
        assert body["live"] and body["changed"], body
        assert watched["at"] - changed < 1.0, watched["at"] - changed

        # The sweeps ran (directly, as the guide says) and hold no advisory
        # lock between runs: each run takes and releases its own.
        wait_for(
            lambda: (
                _sql(
                    "SELECT count(*) FROM health_sweeprun "
                    "WHERE last_finished_at > now() - interval '3 seconds'"
                )[0][0]
                >= 3
            ),
            timeout=15,
            message="the sweeps to run",
        )
        # This test's database only: pg_locks shows the whole cluster's.
        held = (
            "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        wait_for(lambda: not _sql(held), timeout=5, message="no advisory lock held")
    finally:
        http.close()
        web.stop()
        pooled.stop_all()
        directly.stop_all()
