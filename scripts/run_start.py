"""`make run`'s start, a one-shot program of scripts/supervisord.conf's,
started with the servers and the web: it loads Django while they start,
waits until the servers answer, makes the database roles, migrates and
seeds, lets the web serve, starts the workers and beat, and once the turns
worker answers prints the first request. A line per step with its time, in
scripts/run.py's format; an exit code other than 0 stops everything.

One Python process: each `manage.py` start loads Django, the apps and Celery
again, the larger part of a restart's time on a busy machine."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import embedded  # noqa: E402 - the checkout, on the path above
from scripts import pglaunch  # noqa: E402

READY_TIMEOUT_S = float(os.environ.get("RUN_READY_TIMEOUT_S", "60"))
SHOWN = ("console: ", "API key: ", "examples for ")  # seed_demo's lines for the terminal
# The README's first request, ready to paste, with this checkout's demo key.
FIRST_REQUEST = """\
  curl -s -X POST http://127.0.0.1:{port}/api/v1/tickets \\
    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\
    -d '{{"endpoint": "demo.echo", "input": {{"hello": "world"}}, \
"dedupe_key": "first", "wait_s": 5}}'"""


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} run    | {message}", flush=True)


def timed(step: str, fn, *args) -> None:
    started = time.monotonic()
    say(f"{step} ...")
    detail = fn(*args)
    say(f"{step} done in {time.monotonic() - started:.1f} s{f' ({detail})' if detail else ''}")


def wait_until(name: str, ready) -> None:
    """``ready()`` within RUN_READY_TIMEOUT_S, or the start fails with the
    tail of the server's log (supervisord restarts a server that exits)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            log = embedded.var_dir() / "log" / f"{name}.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"{name} did not answer in {READY_TIMEOUT_S:.0f} s; {log}:\n{tail}")
        time.sleep(0.05)


def servers() -> str:
    """Each embedded server answers; the two roles and the database exist
    (scripts/db_roles.sh, as for `make test` and production, idempotent)."""
    sockets = embedded.socket_dir()
    if os.environ.get("RUN_POSTGRES") == "true":
        bindir = Path(os.environ["RUN_PG_BIN"])
        cluster = pglaunch.Cluster(embedded.var_dir() / "pgdata", bindir)
        wait_until("postgres", lambda: cluster.ready(sockets))
        url = f"postgresql://{embedded.SUPERUSER}@/postgres?host={sockets}"
        roles = [embedded.OWNER_ROLE, embedded.APP_ROLE, embedded.DATABASE]
        subprocess.run(
            [ROOT / "scripts" / "db_roles.sh", "--superuser-url", url, *roles],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"},
        )
    if os.environ.get("RUN_REDIS") == "true":
        import redis

        client = redis.Redis(unix_socket_path=str(sockets / "redis.sock"), socket_timeout=1)

        def pong() -> bool:
            try:
                return client.ping()
            except redis.RedisError:
                return False

        wait_until("redis", pong)
    return ", ".join(f"{n} pid {pid}" for n, pid in pids().items() if n in ("postgres", "redis"))


def command(*args: str) -> None:
    """A management command: its lines for the terminal said, the rest
    printed only when it fails."""
    from django.core.management import call_command

    out = io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=out)
    except BaseException:
        print(out.getvalue(), end="", flush=True)
        raise
    for line in out.getvalue().splitlines():
        if line.startswith(SHOWN):
            say(line)


def supervisor():
    from supervisor import childutils

    return childutils.getRPCInterface(os.environ).supervisor


def pids() -> dict[str, int]:
    return {p["name"]: p["pid"] for p in supervisor().getAllProcessInfo() if p["pid"]}


def turns_worker_answers() -> bool:
    """The turns worker answers a ping (through the broker): it consumes."""
    from config.celery import app

    try:
        replies = app.control.ping(timeout=1)
    except Exception:  # noqa: BLE001 - the broker, briefly away: ask again
        return False
    return any(name.startswith("turns@") for reply in replies for name in reply)


def main() -> int:
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # migrate and seed count nothing
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    timed("django", django.setup)
    timed("servers", servers)
    timed("migrate", command, "migrate", "--no-input", "-v0")
    # --allow-production: a local `make run` is the demo (DEBUG stays off).
    timed("seed", command, "seed_demo", "--allow-production")
    from django.db import connections

    connections.close_all()
    (embedded.socket_dir() / "web.go").touch()  # the web serves (scripts/run_web.py)
    supervisor().startProcessGroup("apps", False)  # their lines say how it goes
    port, took = os.environ["PORT"], time.time() - float(os.environ["RUN_STARTED"])
    listed = ", ".join(f"{n} pid {p}" for n, p in pids().items() if n not in ("console", "start"))
    say(f"up in {took:.1f} s ({listed})")
    say(f"console http://127.0.0.1:{port}/  (Ctrl-C stops everything)")
    say("the first request follows when the turns worker is ready")
    while not turns_worker_answers():
        time.sleep(0.5)
    from console.management.commands.seed_demo import OWNER, PASSWORD

    login = f"console: http://127.0.0.1:{port}/login/  user {OWNER}  password {PASSWORD}"
    say(f'{login}; the first request (README, "The first request"):')
    key = (embedded.var_dir() / "demo_api_key").read_text().strip()
    print(FIRST_REQUEST.format(port=port, key=key), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Nothing left to tidy: the interpreter's own teardown of Django, Celery
    # and their imports is slow on a busy machine.
    sys.stdout.flush()
    os._exit(code)
