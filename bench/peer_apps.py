"""The two peers of bench/peers.py, each with one no-op unit of work, each in
its own scratch database on the same PostgreSQL:

- DBOS (durable workflows; its system database ``claimcheck_bench_dbos``):
  ``dbos_noop``, a workflow with no steps;
- Procrastinate (a PostgreSQL job queue; ``claimcheck_bench_procrastinate``):
  ``pc_noop``, a task that returns.

The DBOS worker of the end-to-end phase is this module run as a script
(``python -m bench.peer_apps dbos-worker -c 2 --poll 0.01``, from the
repository root): DBOS runs queued
workflows in the process that launched it, so the worker is a process of its
own, as Celery's and Procrastinate's are. The Procrastinate worker is
Procrastinate's own CLI (``procrastinate --app=bench.peer_apps.pc_app worker``).

Needs the optional dependency group ``bench`` (``uv sync --group bench``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import uuid

import procrastinate
from dbos import DBOS, SetWorkflowID

PG = "postgresql://postgres@127.0.0.1:5432"
DBOS_DB = "claimcheck_bench_dbos" + os.environ.get("BENCH_DB_SUFFIX", "")
PC_DB = "claimcheck_bench_procrastinate" + os.environ.get("BENCH_DB_SUFFIX", "")
DBOS_URL = f"{PG}/{DBOS_DB}"
PC_URL = f"{PG}/{PC_DB}"
# Admissions go to a queue nobody consumes; the end-to-end phase to one a
# worker of the given concurrency consumes.
ADMIT_QUEUE = "bench_admit"
E2E_QUEUE = "bench_e2e"
APP_NAME = "claimcheck-bench"


# --- DBOS ---------------------------------------------------------------------------------------


@DBOS.workflow(name="bench.noop")
def dbos_noop(payload: dict) -> None:
    return None


def launch_dbos(*, executor_id: str, listen: list[str]) -> None:
    """DBOS in this process against its own system database. ``listen``: the
    queues this process dequeues from (none for the enqueuing bench process).
    A fixed application version, so the worker dequeues what the bench
    process enqueued whatever each computes from its sources."""
    DBOS(
        config={
            "name": APP_NAME,
            "system_database_url": DBOS_URL,
            "application_version": "bench",
            "executor_id": executor_id,
            "log_level": "WARNING",
        }
    )
    DBOS.listen_queues(listen)
    DBOS.launch()


def register_queues(*, concurrency: int, poll_s: float) -> tuple:
    admit = DBOS.register_queue(ADMIT_QUEUE, on_conflict="always_update")
    e2e = DBOS.register_queue(
        E2E_QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=poll_s,
        on_conflict="always_update",
    )
    return admit, e2e


def dbos_worker(concurrency: int, poll_s: float) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    launch_dbos(executor_id="bench-worker", listen=[E2E_QUEUE])
    _, queue = register_queues(concurrency=concurrency, poll_s=poll_s)
    # Ready only once the queue's worker thread has run a workflow: DBOS
    # starts that thread up to a second after the queue is registered.
    with SetWorkflowID(f"ready-{uuid.uuid4().hex}"):
        queue.enqueue(dbos_noop, {}).get_result()
    print("ready.", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


# --- Procrastinate ------------------------------------------------------------------------------

pc_app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PC_URL))


@pc_app.task(name="bench.noop", queue=E2E_QUEUE)
def pc_noop(payload: dict) -> None:
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the DBOS worker of bench/peers.py")
    parser.add_argument("role", choices=["dbos-worker"])
    parser.add_argument("-c", "--concurrency", type=int, default=2)
    parser.add_argument("--poll", type=float, default=0.01, help="queue polling interval, s")
    args = parser.parse_args()
    dbos_worker(args.concurrency, args.poll)
    sys.exit(0)
