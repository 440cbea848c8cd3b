"""Do callers waiting with ``wait_s`` block the web tier? 100 concurrent
``POST /api/v1/tickets`` with ``wait_s`` on an endpoint no worker serves (they
wait their whole ``wait_s``), while another client times sequential
``GET /api/v1/tickets/{id}``; the same GETs timed with nobody waiting, in the
same run. The ratio of the two p50s is the figure (1.0: waiters cost the
other requests nothing).

    .venv/bin/python bench/waiters.py [--waiters 100] [--threads 64] [-w 2] [--gets 200]
    .venv/bin/python bench/waiters.py --console-tabs 100 --threads 4 -w 5

``--console-tabs N``: the waiters are N console pages' live-region watches
(``GET /live/``, a staff user's session; console/views/live.py) instead, on the
production process model (``deploy/gunicorn.conf.py``: 2 x cores + 1
processes of 4 threads): each process holds at most ``CONSOLE_LIVE_SLOTS``
(2) of them, and the rest are answered at once ("live": false: those pages
poll), so the API keeps the other threads. Printed: how many watches were
held and how many sent back, beside the same ratio.

Server: gunicorn ``gthread``, ``-w`` workers x ``--threads`` threads (a
waiter occupies a thread, not a process, and holds no database connection
while it waits: tickets/waits.py), ``DB_CONN_MAX_AGE=0``. The waiters start
20 ms apart, so their admissions never need 100 sessions at once. Database
``claimcheck_bench_waiters``
(plus ``BENCH_DB_SUFFIX``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, where bench/http.py would
# shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

_HERE = Path(__file__).resolve().parent

from bench import benchlib  # noqa: E402
from bench.http import free_port  # noqa: E402

ADDRESS = "bench.waiters"


def request(port: int, method: str, path: str, key: str, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data, (time.perf_counter() - started) * 1e3


def time_gets(port: int, key: str, ticket_id: str, count: int) -> dict:
    samples = []
    for _ in range(count):
        status, _, ms = request(port, "GET", f"/api/v1/tickets/{ticket_id}", key)
        assert status == 200, status
        samples.append(ms)
    samples.sort()
    return {"p50_ms": samples[len(samples) // 2], "p99_ms": samples[int(len(samples) * 0.99)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=100)
    parser.add_argument("--threads", type=int, default=64, help="gthread threads per worker")
    parser.add_argument("-w", "--workers", type=int, default=2)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--wait-s", type=float, default=20.0)
    parser.add_argument("--console-tabs", type=int, default=0, help="watches, not wait_s")
    args = parser.parse_args()
    benchlib.start_wall_clock(600)
    benchlib.use_database("claimcheck_bench_waiters")
    benchlib.recreate_database()
    benchlib.setup_django()
    from django.db import connection

    from accounts.keys import create_api_key
    from endpoints.services import create_endpoint

    create_endpoint(address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"})
    _, key = create_api_key(username="bench-waiters")
    cookie = ""
    if args.console_tabs:
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.test import Client

        staff = get_user_model().objects.create_user("bench-tabs", is_staff=True)
        client = Client()
        client.force_login(staff)
        cookie = (
            f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        )
    connection.close()
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-waiters-"))
    env = benchlib.bench_env()
    env["DJANGO_SETTINGS_MODULE"] = "bench.http_settings"
    # A thread keeps no session between requests: 128 threads must not pin
    # 128 of the shared server's 100 connections.
    env["DB_CONN_MAX_AGE"] = "0"
    env["CONSOLE_LIVE_WAIT_S"] = str(args.wait_s)
    server = benchlib.Proc(
        "bench-gunicorn-gthread",
        [sys.executable, "-m", "gunicorn", "config.wsgi:application",
         "--bind", f"127.0.0.1:{port}", "--workers", str(args.workers),
         "--worker-class", "gthread", "--threads", str(args.threads),
         "--log-level", "info", "--error-logfile", "-",
         "--config", str(_HERE / "gunicorn_conf.py")],
        log_dir, marker=b"Listening at", env=env,
    )  # fmt: skip
    try:
        server.wait_ready()
        benchlib.wait_for(
            lambda: server.log().count(b"loaded the application") >= args.workers,
            timeout=120,
            interval=0.1,
            what="gunicorn workers",
        )
        # Queued for good (no worker runs), and the key's own: GET shows it.
        status, data, _ = request(
            port, "POST", "/api/v1/tickets", key, {"endpoint": ADDRESS, "input": {}}
        )
        assert status == 201, (status, data[:200])
        probe = json.loads(data)["id"]
        time_gets(port, key, str(probe), 50)  # warm every worker
        quiet = time_gets(port, key, str(probe), args.gets)
        results: list = []
        waiters = args.console_tabs or args.waiters
        if args.console_tabs:  # what the pages show: nothing changes meanwhile
            from tickets.selectors import ledger_change_token

            token = ledger_change_token()
            connection.close()

        def waiter(i: int) -> None:
            if args.console_tabs:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                started = time.monotonic()
                conn.request("GET", f"/live/?token={token}", headers={"Cookie": cookie})
                answer = json.loads(conn.getresponse().read())
                conn.close()
                waited = time.monotonic() - started
                if answer.get("live") and not answer.get("changed") and waited >= args.wait_s * 0.9:
                    results.append("held")
                elif not answer.get("live"):
                    results.append("sent back")
                else:
                    results.append(f"other {answer} after {waited:.1f} s")
                return
            body = {"endpoint": ADDRESS, "input": {"w": i}, "wait_s": args.wait_s}
            status, _, _ = request(port, "POST", "/api/v1/tickets", key, body)
            results.append(status)

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(waiters)]
        for t in threads:  # staggered: admissions never need 100 sessions at once
            t.start()
            time.sleep(0.02)
        time.sleep(1.0)  # every waiter admitted and waiting
        busy = time_gets(port, key, str(probe), args.gets)
        still_waiting = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join()
    finally:
        server.stop()
        benchlib.drop_database()
    ratio = quiet["p50_ms"] / busy["p50_ms"]
    if args.console_tabs:
        held = results.count("held")
        others = [r for r in results if r.startswith("other")]
        print(
            f"{args.console_tabs} console watches on {args.workers} x {args.threads} threads: "
            f"{held} held (waiting {args.wait_s:.0f} s), {results.count('sent back')} sent "
            f"back to polling at once, other: {others[:3]}; "
            f"GET p50 {quiet['p50_ms']:.1f} ms quiet, "
            f"{busy['p50_ms']:.1f} ms meanwhile (p99 {quiet['p99_ms']:.1f} / "
            f"{busy['p99_ms']:.1f} ms): ratio quiet/busy p50 {ratio:.2f}"
        )
        return
    print(
        f"GET /api/v1/tickets/{{id}} with nobody waiting: p50 {quiet['p50_ms']:.1f} ms "
        f"p99 {quiet['p99_ms']:.1f} ms; with {args.waiters} wait_s callers waiting "
        f"({still_waiting} still waiting when the GETs ended): p50 {busy['p50_ms']:.1f} ms "
        f"p99 {busy['p99_ms']:.1f} ms; ratio quiet/busy p50 {ratio:.2f}; "
        f"waiters' statuses {sorted(set(results))} ({len(results)} answered)"
    )
    print(
        json.dumps(
            {
                "bench": "waiters",
                "waiters": args.waiters,
                "workers": args.workers,
                "threads": args.threads,
                "quiet": quiet,
                "busy": busy,
                "still_waiting": still_waiting,
                "ratio": round(ratio, 3),
            },
            separators=(",", ":"),
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
