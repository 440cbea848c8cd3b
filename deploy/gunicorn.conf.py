"""gunicorn settings for Claimcheck (docs/howto/deploy.md). Command-line flags win
over these; the environment tunes them without editing the file.

    gunicorn config.wsgi:application -c deploy/gunicorn.conf.py
"""

import multiprocessing
import os

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# Processes: 2 x cores + 1 is gunicorn's rule of thumb for sync work; the
# admission path waits on PostgreSQL, so threads per process cover the wait
# (WEB_CONCURRENCY, GUNICORN_THREADS override both).
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() * 2 + 1))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
# Above ADMISSION_MAX_WAIT_S (60 s by default): a POST with wait_s may hold
# its thread that long.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "75"))
graceful_timeout = 20
keepalive = 5
# Restart each process now and then (memory hygiene), jittered so they do
# not all restart together.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = max_requests // 10
accesslog = os.environ.get("GUNICORN_ACCESS_LOG") or None  # "-" for stdout
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def child_exit(server, worker):
    """prometheus-client multiprocess mode: a dead process's live gauges
    leave with it (its counters stay in the host's totals)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
