"""The embedded default (what `make run` starts) needs no services: SQLite
under var/ and Celery's filesystem broker. Runs the real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
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
        [*manage, "seed_demo"],
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
    procs = [
        subprocess.Popen(
            [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                "turns",
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
        ),
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
    finally:
        for p in procs:
            os.killpg(p.pid, 15)
            p.wait(timeout=15)
