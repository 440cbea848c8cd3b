"""The embedded default (what `make run` starts) needs no services: SQLite
under var/ and Celery's filesystem broker. Runs the real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url, body=None, key=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None)
    if body:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback only
        return resp.status, resp.read()


def test_embedded_default_serves_and_runs_a_turn_without_services(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(CLAIMCHECK_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(ROOT), C_FORCE_ROOT="1")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    seeded = subprocess.run(
        [*manage, "seed_demo", "--allow-production"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    key = seeded.stdout.strip().splitlines()[-1].split("API key: ")[1]
    assert (tmp_path / "var" / "db.sqlite3").exists()
    port = _free_port()

    def worker() -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                # The control queue's worker runs the dispatcher (polling on
                # SQLite), which publishes what admission marked as owed.
                "turns,control",
                "-c",
                "1",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def terminate(proc: subprocess.Popen, within: float) -> float:
        """SIGTERM to the process group, as honcho sends it; its exit time."""
        started = time.monotonic()
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # leave nothing behind, then fail
            proc.wait()
            raise
        return time.monotonic() - started

    procs = [
        subprocess.Popen(
            [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        ),
        worker(),
    ]
    base = f"http://127.0.0.1:{port}"
    try:

        def up():
            try:
                return _http(f"{base}/login/")[0] == 200
            except OSError:
                return False

        wait_for(up, timeout=30, interval=0.2, message="the web server")
        assert _http(f"{base}/api/v1/docs")[0] == 200
        # The console's own CSS and htmx are served without DEBUG (whitenoise).
        assert _http(f"{base}/static/css/console.css")[0] == 200
        assert _http(f"{base}/static/js/htmx.min.js")[0] == 200
        status, body = _http(
            f"{base}/api/v1/tickets",
            {"endpoint": "demo.echo", "input": {"hi": 1}, "wait_s": 20},
            key,
        )
        ticket = json.loads(body)
        assert status == 201
        assert ticket["state"] == "succeeded", ticket
        assert ticket["result"] == {"echo": {"hi": 1}}

        # The idle worker (its pool process has run a turn) exits on SIGTERM.
        terminate(procs[1], within=15)

        # SIGTERM while demo.stubborn runs: the turn is stopped by the
        # escalation (grace 5 s, SIGTERM, kill_after 2.5 s, SIGKILL) with its
        # exit as the evidence, and the worker exits.
        procs.append(worker())
        status, body = _http(
            f"{base}/api/v1/tickets", {"endpoint": "demo.stubborn", "input": {}}, key
        )
        stubborn = json.loads(body)["id"]

        def ticket_state():
            return json.loads(_http(f"{base}/api/v1/tickets/{stubborn}", key=key)[1])

        wait_for(lambda: ticket_state()["state"] == "running", timeout=60, message="the turn")
        time.sleep(0.5)  # the isolated child is in its callable (and ignores SIGTERM)
        took = terminate(procs[2], within=5 + 2.5 + 6)
        stopped = ticket_state()
        assert stopped["state"] == "failed", (stopped, took)
        assert stopped["error"]["code"] == "interrupted"
        assert stopped["error"]["signals"] == ["SIGTERM", "SIGKILL"]
    finally:
        for p in procs:
            if p.poll() is None:
                terminate(p, within=15)
