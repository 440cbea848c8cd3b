"""Can one key starve another? One tenant's key runs 40 ``wait_s: 60``
long-polls (each re-posted when it answers) and floods admissions, while
another tenant's key times sequential ``GET /api/v1/tickets``: the same GETs
timed with nobody else on the server first. Against gunicorn with the
production settings (``deploy/gunicorn.conf.py``: 2 x cores + 1 processes of
4 gthread threads), three times: with the fair-share limits off ("off"), at
their defaults (core/fairshare.py, "on"), and at their defaults behind
nginx as deployed (deploy/nginx.conf, "nginx": its per-key edge limit
refuses floods before any Python runs). The figure is the victim's p99
under attack over its quiet p99 (the goal: within 2x).

    .venv/bin/python bench/fairshare.py [--long-polls 40] [--flood-per-s 20] [--seconds 20]

The attacker runs in a process of its own (its threads must not share the
measuring client's interpreter lock). A GET that gets no answer within
``--get-timeout`` counts as that long. Database ``claimcheck_bench_fairshare``
(plus ``BENCH_DB_SUFFIX``); the counters in ``BENCH_BROKER_URL``'s Redis.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, where bench/http.py would
# shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from bench import benchlib  # noqa: E402
from bench.http import free_port  # noqa: E402
from tests.nginx import Nginx  # noqa: E402
from tests.nginx import available as nginx_available  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ADDRESS = "bench.fairshare"
LIMITS_OFF = benchlib.FAIR_SHARE_OFF


def request(port, method, path, key, body=None, timeout=120.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    try:
        conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, data, (time.perf_counter() - started) * 1e3
    finally:
        conn.close()


def time_gets(port: int, key: str, count: int, timeout: float, until: float = 0.0) -> dict:
    samples, statuses = [], Counter()
    for _ in range(count):
        if until and time.monotonic() > until:
            break
        try:
            status, _, ms = request(port, "GET", "/api/v1/tickets?limit=20", key, timeout=timeout)
        except OSError:  # no answer in time: the thread it needed was taken
            status, ms = "timeout", timeout * 1e3
        statuses[status] += 1
        samples.append(ms)
    samples.sort()
    return {
        "n": len(samples),
        "p50_ms": round(samples[len(samples) // 2], 1),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 1),
        "statuses": dict(statuses),
    }


def attack(port: int, key: str, args, out) -> None:
    """The noisy tenant, in its own process: long-polls that re-post when
    answered (after ``--repoll-s`` if answered at once, as a poller would), and a
    steady flood of admissions that ignores 429s."""
    stop = time.monotonic() + args.seconds
    statuses: Counter = Counter()
    lock = threading.Lock()

    def note(status) -> None:
        with lock:
            statuses[status] += 1

    def long_poll(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            body = {"endpoint": ADDRESS, "input": {"poll": i, "n": n}, "wait_s": 60}
            n += 1
            started = time.monotonic()
            try:
                status, _, _ = request(port, "POST", "/api/v1/tickets", key, body, timeout=90)
            except OSError:
                status = "error"
            note(f"poll {status}")
            if time.monotonic() - started < 30:
                time.sleep(args.repoll_s)

    def flood() -> None:
        n = 0
        while time.monotonic() < stop:
            started = time.monotonic()
            try:
                status, _, _ = request(
                    port, "POST", "/api/v1/tickets", key, {"endpoint": ADDRESS, "input": {"f": n}}
                )
            except OSError:
                status = "error"
            note(f"flood {status}")
            n += 1
            time.sleep(max(0.0, 1.0 / args.flood_per_s - (time.monotonic() - started)))

    threads = [
        threading.Thread(target=long_poll, args=(i,), daemon=True) for i in range(args.long_polls)
    ]
    threads += [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, stop - time.monotonic()))
    out.put(dict(statuses))


def phase(label: str, limits: dict[str, str], args, keys, log_dir: Path, via_nginx: bool) -> dict:
    with contextlib.ExitStack() as stack:
        return _phase(label, limits, args, keys, log_dir, via_nginx, stack)


def _phase(label, limits, args, keys, log_dir, via_nginx, stack) -> dict:
    victim, attacker = keys
    port = upstream = free_port()
    env = benchlib.bench_env()
    for name in LIMITS_OFF:  # the other benchmarks' "off": here the settings' defaults
        env.pop(name, None)
    env.update(limits)
    env.update(
        GUNICORN_BIND=f"127.0.0.1:{upstream}",
        DB_CONN_MAX_AGE="0",  # 40 waiters must not pin 40 sessions of the shared server
        RATE_LIMIT_STORAGE_URL=benchlib.BROKER_URL,
    )
    server = benchlib.Proc(
        f"gunicorn-{label}",
        [sys.executable, "-m", "gunicorn", "config.wsgi:application",
         "-c", str(ROOT / "deploy" / "gunicorn.conf.py"), "--error-logfile", "-"],
        log_dir, marker=b"Booting worker", env=env,
    )  # fmt: skip
    try:
        server.wait_ready(timeout=120)
        if via_nginx:
            proxy = stack.enter_context(Nginx(upstream=upstream, directory=log_dir / label))
            port = proxy.port
        benchlib.wait_for(
            lambda: _answers(port, victim), timeout=120, interval=0.2, what="the web to answer"
        )
        time_gets(port, victim, 100, args.get_timeout)  # warm every process
        quiet = time_gets(port, victim, args.gets, args.get_timeout)
        out = multiprocessing.get_context("fork").SimpleQueue()
        attacker_proc = multiprocessing.get_context("fork").Process(
            target=attack,
            args=(port, attacker, args, out),
        )
        attacker_proc.start()
        time.sleep(3.0)  # the long-polls are in and the flood is running
        busy = time_gets(
            port, victim, 10**6, args.get_timeout, until=time.monotonic() + args.seconds - 4
        )
        attacker_proc.join(timeout=args.seconds + 30)
        attacks = out.get() if not out.empty() else {}
        # Quiet again, with the attacker's tickets now in the ledger: what the
        # data alone costs, apart from the threads the attack held (its
        # long-polls wait out their 60 s on the server first).
        benchlib.wait_for(
            lambda: time_gets(port, victim, 1, 1.0)["statuses"].get(200),
            timeout=90,
            interval=0.5,
            what="the attacker's long-polls to end",
        )
        after = time_gets(port, victim, args.gets // 2, args.get_timeout)
    finally:
        server.stop()
    return {
        "label": label,
        "settings": limits,
        "quiet": quiet,
        "busy": busy,
        "after": after,
        "attacker": attacks,
        "loadavg_1m": round(os.getloadavg()[0], 1),
    }


def _answers(port: int, key: str) -> bool:
    try:
        return request(port, "GET", "/api/v1/tickets?limit=1", key, timeout=5)[0] == 200
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-polls", type=int, default=40)
    parser.add_argument("--flood-per-s", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--repoll-s", type=float, default=1.0, help="pause of a long-poll answered at once"
    )
    parser.add_argument("--gets", type=int, default=200, help="quiet GETs")
    parser.add_argument("--get-timeout", type=float, default=10.0)
    parser.add_argument("--only", choices=["off", "on", "nginx"], help="one phase only")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a setting of 'on'"
    )
    args = parser.parse_args()
    benchlib.start_wall_clock(900)
    benchlib.use_database("claimcheck_bench_fairshare")
    benchlib.recreate_database()
    benchlib.setup_django()
    from django.db import connection

    from accounts.keys import create_api_key
    from endpoints.services import create_endpoint

    # No worker serves it: every ticket stays queued, every wait_s waits it out.
    create_endpoint(address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"})
    _, victim = create_api_key(username="bench-victim")
    _, attacker = create_api_key(username="bench-attacker")
    connection.close()
    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-fairshare-"))
    results = []
    try:
        chosen = dict(item.split("=", 1) for item in args.set)
        for label, limits, via_nginx in (
            ("off", LIMITS_OFF, False),
            ("on", chosen, False),
            ("nginx", chosen, True),
        ):
            if args.only and args.only != label:
                continue
            if via_nginx and not nginx_available():
                print("nginx is not installed (make proxy): its phase is skipped")
                continue
            benchlib.flush_broker()  # the counters start empty
            results.append(phase(label, limits, args, (victim, attacker), log_dir, via_nginx))
    finally:
        benchlib.drop_database()
    for r in results:
        q, b = r["quiet"], r["busy"]
        print(
            f"limits {r['label']:>5}: victim GET /tickets quiet p50 {q['p50_ms']} ms p99 "
            f"{q['p99_ms']} ms; under attack p50 {b['p50_ms']} ms p99 {b['p99_ms']} ms "
            f"({b['n']} GETs, {b['statuses']}); p99 ratio {b['p99_ms'] / q['p99_ms']:.2f}; "
            f"quiet after p50 {r['after']['p50_ms']} ms p99 {r['after']['p99_ms']} ms; "
            f"attacker {dict(sorted(r['attacker'].items()))}; {r['settings'] or 'defaults'}; "
            f"machine load {r['loadavg_1m']} on {os.cpu_count()} cores"
        )
    print(json.dumps({"bench": "fairshare", "phases": results}, separators=(",", ":")))


if __name__ == "__main__":
    main()
