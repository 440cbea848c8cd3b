"""What Django's connection pool (DATABASE_POOL_MAX) changes for a web tier
with more threads than the database has connections.

    .venv/bin/python bench/pool.py [--threads 40] [--requests 800] [--pool 6]

- A private PostgreSQL (tests/faults/cluster.py) with ``max_connections =
  20``, migrated, one endpoint and a staff key.
- gunicorn as deploy/gunicorn.conf.py runs it: 2 processes of ``threads / 2``
  threads each (40 in all by default).
- Load: ``threads`` client threads at once, ``requests`` admissions in all
  (``POST /api/v1/tickets``, a distinct dedupe key each), counted by status.
- Twice: without a pool (``DB_CONN_MAX_AGE`` 60: each busy thread holds its
  own connection, and the 21st connect is refused: 503 ``unavailable``),
  then with ``DATABASE_POOL_MAX=pool`` per process (the threads share the
  pool's connections and wait up to ``DATABASE_POOL_TIMEOUT_S`` for one).

Prints one ``POOL-FIGURES`` JSON line per mode.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's ``http``: the repository root instead.
sys.path[0] = str(ROOT)

import httpx  # noqa: E402

from tests.faults.cluster import PrivatePostgres, free_port  # noqa: E402

SETUP = """
import django
django.setup()
from django.core.management import call_command
from accounts.keys import create_api_key
from endpoints.services import create_endpoint
call_command("migrate", "--no-input", verbosity=0)
create_endpoint(address="pool.echo", runner={"kind": "python", "path": "runtime.demo.echo"})
_, key = create_api_key(username="pool-bench", staff=True)
print(key)
"""


def env_for(db_url: str, var: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(ROOT),
        DATABASE_URL=db_url,
        CELERY_BROKER_URL=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13"),
        CLAIMCHECK_VAR_DIR=str(var),
        SECRET_KEY="pool-bench-only-" + "x" * 40,
        LOG_LEVEL="WARNING",
        **extra,
    )
    return env


def load(url: str, key: str, threads: int, requests: int, tag: str) -> dict:
    statuses: collections.Counter = collections.Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    start = threading.Barrier(threads)

    def run() -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client:
            start.wait()
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                t0 = time.monotonic()
                try:
                    resp = client.post(
                        "/api/v1/tickets",
                        json={"endpoint": "pool.echo", "input": {}, "dedupe_key": f"{tag}-{i}"},
                    )
                    status = str(resp.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    statuses[status] += 1
                    latencies.append(time.monotonic() - t0)

    t0 = time.monotonic()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    latencies.sort()
    return {
        "statuses": dict(sorted(statuses.items())),
        "seconds": round(time.monotonic() - t0, 1),
        "p50_s": round(latencies[len(latencies) // 2], 3),
        "p99_s": round(latencies[int(len(latencies) * 0.99) - 1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=40)
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--pool", type=int, default=6, help="DATABASE_POOL_MAX per process")
    args = parser.parse_args()

    pg = PrivatePostgres().init()
    with open(pg.data / "postgresql.conf", "a") as conf:
        conf.write("max_connections = 20\n")
    pg.start()
    var = pg.base / "var"
    var.mkdir()
    try:
        pg.execute("CREATE DATABASE pool_bench")
        db_url = pg.url("pool_bench")
        done = subprocess.run(
            [sys.executable, "-c", SETUP],
            cwd=ROOT,
            env=env_for(db_url, var, {}),
            capture_output=True,
            text=True,
            check=True,
        )
        key = done.stdout.strip().splitlines()[-1]
        modes = {
            "no_pool": {"DB_CONN_MAX_AGE": "60"},
            "pool": {"DATABASE_POOL_MAX": str(args.pool), "DATABASE_POOL_TIMEOUT_S": "10"},
        }
        for mode, extra in modes.items():
            port = free_port()
            web = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "config.wsgi:application",
                 "-c", "deploy/gunicorn.conf.py"],
                cwd=ROOT,
                env={**env_for(db_url, var, extra), "GUNICORN_BIND": f"127.0.0.1:{port}",
                     "WEB_CONCURRENCY": "2", "GUNICORN_THREADS": str(args.threads // 2)},
                stdout=subprocess.DEVNULL,  # a 503 per refused connect: counted below
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit("gunicorn did not start")
                    time.sleep(0.2)
                figures = load(url, key, args.threads, args.requests, mode)
            finally:
                os.killpg(web.pid, signal.SIGTERM)
                web.wait(timeout=30)
            line = {"mode": mode, "threads": args.threads, "max_connections": 20, **figures}
            if mode == "pool":
                line["pool_per_process"] = args.pool
            print("POOL-FIGURES", json.dumps(line), flush=True)
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
