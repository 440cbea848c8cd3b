"""Admission over HTTP: gunicorn serving config.wsgi, loaded by wrk, against a
trivial django-ninja route that inserts one row (the framework floor), in
the same run, on the same server.

    .venv/bin/python bench/http.py [-d 10] [--reps 3] [--connections 8,32] [-w N]

- Server: ``gunicorn config.wsgi`` on 127.0.0.1 (a free port), sync workers,
  the production process count 2 x cores + 1 (5 on this 2-core machine),
  production settings (``CONN_MAX_AGE`` 60, DEBUG off) against the database
  ``claimcheck_bench_http`` and Redis db 11. ``DJANGO_SETTINGS_MODULE`` is
  ``bench.http_settings``: the project's settings with the bench-only URLconf
  ``bench/http_urls.py``, which adds the floor routes; nothing else differs.
- Load: ``wrk -t 2 -c C -d D`` (Debian's wrk; ``apt-get install -y wrk``) with
  bench/http_post.lua, which POSTs the same JSON body to every route, a
  distinct dedupe key per request. wrk's timeout is its default, 2 s.
- Routes, each for D seconds at each connection count, interleaved within a
  repetition: ``tickets`` (``POST /api/v1/tickets``, bearer key, a new ticket
  and its dispatch published to Redis), ``floor`` (``POST /bench/floor``:
  ninja parses the body into a schema and inserts one row; no auth),
  ``floor_auth`` (the same behind the project's bearer-key auth: a
  diagnostic that splits the auth lookup from the rest).

Every phase checks the server did the work: the rows written match the 2xx
responses (up to the requests in flight when wrk stopped). A figure is the
median over repetitions; the ratio is tickets / floor at the same number of
connections. wrk runs on the same 2 cores as the server, PostgreSQL and
Redis, so absolute figures are the machine's, the ratio is the code's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is bench/http.py: run as a script, Python puts bench/ first on
# sys.path, where this file would shadow the standard library's ``http`` for
# everything imported below. Import from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench import benchlib  # noqa: E402

DB_NAME = "claimcheck_bench_http"
ADDRESS = "bench.http"
ROUTES = {
    "tickets": "/api/v1/tickets",
    "floor": "/bench/floor",
    "floor_auth": "/bench/floor-auth",
}
LUA = _HERE / "http_post.lua"
# The floor route's table (bench/http_urls.py inserts into it).
FLOOR_DDL = "CREATE TABLE bench_http_floor (id uuid PRIMARY KEY, k text, v jsonb)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_wrk(url: str, route: str, conns: int, seconds: float, key: str, prefix: str) -> dict:
    env = dict(os.environ)
    env.update(
        BENCH_PATH=ROUTES[route],
        BENCH_ENDPOINT=ADDRESS,
        BENCH_API_KEY=key if route != "floor" else "",
        BENCH_KEY_PREFIX=prefix,
    )
    proc = subprocess.run(
        ["wrk", "-t", "2", "-c", str(conns), "-d", f"{seconds:g}s", "-s", str(LUA), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BENCH_RESULT "))
    out = json.loads(line.removeprefix("BENCH_RESULT "))
    errors = out["errors"]
    out["error_total"] = sum(errors.values())
    out["ok"] = out["requests"] - errors["status"]
    out["per_s"] = out["requests"] / (out["duration_us"] / 1e6)
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU of each of these processes still alive
    (``/proc/<pid>/stat``)."""
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return seconds


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two readings: by the processes alive at the second
    (one that started in between counts from zero; one that exited in
    between is lost, not subtracted)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def backend_pids(conn) -> list[int]:
    """The PostgreSQL backends serving the gunicorn workers (every client
    backend on the bench database but this script's own)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchall()
    return [pid for (pid,) in rows]


def rows_written(conn, route: str, prefix: str) -> int:
    if route == "tickets":
        sql = "SELECT count(*) FROM tickets_ticket WHERE dedupe_key LIKE %s"
    else:
        sql = "SELECT count(*) FROM bench_http_floor WHERE k LIKE %s"
    return conn.execute(sql, (prefix + "-%",)).fetchone()[0]


def launch_server(port: int, workers: int, log_dir: Path) -> benchlib.Proc:
    """``gunicorn config.wsgi`` with ``workers`` sync workers on 127.0.0.1,
    the bench's settings (bench.http_settings: the floor routes mounted)
    against benchlib's database and broker."""
    env = benchlib.bench_env()
    env["DJANGO_SETTINGS_MODULE"] = "bench.http_settings"
    return benchlib.Proc(
        "bench-gunicorn",
        [sys.executable, "-m", "gunicorn", "config.wsgi:application",
         "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
         "--worker-class", "sync", "--log-level", "info", "--error-logfile", "-",
         "--config", str(_HERE / "gunicorn_conf.py")],
        log_dir,
        marker=b"Listening at",
        env=env,
    )  # fmt: skip


def wait_server(server: benchlib.Proc, workers: int) -> None:
    server.wait_ready()
    benchlib.wait_for(
        lambda: server.log().count(b"loaded the application") >= workers,
        timeout=120,
        interval=0.1,
        what=f"{workers} gunicorn workers",
    )


def warm_routes(url: str, api_key: str, workers: int, routes) -> None:
    """The first requests of a worker on a route import and build what it
    needs (1-2 s each under load): warm every route until a round has no
    request slower than 1 s."""
    for route in routes:
        for attempt in range(6):
            warm = run_wrk(url, route, 2 * workers, 3, api_key, f"warm{attempt}-{route}")
            if warm["requests"] and warm["max_us"] < 1e6:
                break


def measure_phase(
    url: str,
    server: benchlib.Proc,
    db,
    route: str,
    conns: int,
    seconds: float,
    api_key: str,
    prefix: str,
) -> dict:
    """One route for ``seconds`` at ``conns`` connections: wrk's figures,
    the CPU per request of the web workers and of their database backends
    (what the code costs, whatever the load), checked against the rows the
    server wrote."""
    workers_now, backends_now = worker_pids(server.proc.pid), backend_pids(db)
    cpu_before = cpu_seconds(workers_now), cpu_seconds(backends_now)
    got = run_wrk(url, route, conns, seconds, api_key, prefix)
    backends_now = sorted(set(backends_now) | set(backend_pids(db)))
    cpu_after = cpu_seconds(workers_now), cpu_seconds(backends_now)
    for i, name in enumerate(("worker_cpu_ms", "backend_cpu_ms")):
        used = cpu_used(cpu_before[i], cpu_after[i])
        got[name] = used / max(1, got["requests"]) * 1e3
    written = rows_written(db, route, prefix)
    # Requests in flight when wrk stopped or gave up (its timeout) may
    # still be written after it counted.
    slack = conns + got["errors"]["timeout"]
    assert got["ok"] <= written <= got["ok"] + slack, (
        f"{prefix}: {got['ok']} 2xx responses but {written} rows written"
    )
    return got


def profile_routes(api_key: str, count: int) -> None:
    """The routes in this process through Django's test Client (the same
    settings, URLconf and middleware, no network, no gunicorn): time and
    statements per request, then each route under a CPU-time sampler
    (bench/http_profile.py) and its CPU by part of the request."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings

    from bench import http_profile

    body = '{"endpoint":"%s","dedupe_key":"%s","input":{"key":"%s","text":"benchmark admission"}}'
    with override_settings(ROOT_URLCONF="bench.http_urls"):
        client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {api_key}")

        def post(route: str, i: int) -> None:
            key = f"prof-{route}-{i}"
            response = client.post(
                ROUTES[route], body % (ADDRESS, key, key), content_type="application/json"
            )
            assert response.status_code == 201, response.content[:300]

        for route in ROUTES:
            for i in range(20):
                post(route, -1 - i)  # warm
            # Counted by an execute wrapper: the request resets Django's
            # query log.
            statements: list[str] = []
            with connection.execute_wrapper(
                lambda execute, sql, *a, seen=statements: seen.append(sql) or execute(sql, *a)
            ):
                post(route, 10**6)
            started = time.perf_counter()
            cpu = time.process_time()
            for i in range(count):
                post(route, i)
            ms = (time.perf_counter() - started) / count * 1e3
            cpu_ms = (time.process_time() - cpu) / count * 1e3
            print(
                f"  in process: {route:<10} {ms:6.2f} ms per request ({cpu_ms:.2f} ms CPU), "
                f"{len(statements)} statements"
            )
        for route in ROUTES:
            cpu = time.process_time()
            with http_profile.CpuSampler() as sampler:
                for i in range(count):
                    post(route, 2 * 10**6 + i)
            cpu_ms = (time.process_time() - cpu) / count * 1e3
            raw = sampler.raw()
            # The server's part of the CPU: the samples inside its handler.
            server_ms = cpu_ms * http_profile.in_request_share(raw, IN_PROCESS)
            print(f"--- CPU by part: {count} POST {ROUTES[route]} in process ---")
            print(
                http_profile.report(
                    raw,
                    requests=count,
                    rate=sampler.rate,
                    start_frame=IN_PROCESS,
                    ms_per_request=server_ms,
                )
            )
    benchlib.flush_broker()


# The test Client's handler: what it does before (building the request) is
# the client's, not the server's.
IN_PROCESS = "ClientHandler.__call__ "
SPY_RATE = 200


def spy_routes(url: str, pid: int, api_key: str, seconds: float, log_dir: Path, keep: bool):
    """Each route for ``seconds`` at 8 connections while ``py-spy record``
    samples every gunicorn worker (``--nonblocking``: the workers are never
    paused), then where the workers' time went by part of the request
    (bench/http_profile.py)."""
    from bench import http_profile

    spy = http_profile.py_spy_binary()
    for route in ROUTES:
        out = log_dir / f"py-spy-{route}.txt"
        recorder = subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
             "--format", "raw", "--rate", str(SPY_RATE), "--duration", f"{seconds + 2:g}",
             "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        # py-spy attaches within a fraction of a second: the first requests
        # may go unsampled, which changes no proportion.
        got = run_wrk(url, route, 8, seconds, api_key, f"spy-{route}")
        _, err = recorder.communicate(timeout=seconds + 60)
        if recorder.returncode != 0:
            raise RuntimeError(f"py-spy failed: {err.decode()[-2000:]}")
        print(f"--- py-spy: {route}, {got['per_s']:.0f} req/s at 8 connections ---")
        print(http_profile.report(out.read_text(), requests=got["requests"], rate=SPY_RATE))
        if keep:
            print(f"  (collapsed stacks: {out})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (<= 5)")
    parser.add_argument("--connections", default="8,32", help="comma-separated counts")
    parser.add_argument("-w", "--workers", type=int, default=2 * (os.cpu_count() or 1) + 1)
    parser.add_argument("--keep", action="store_true", help="keep the database and the log")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then N requests per route in process, and a cProfile")  # fmt: skip
    parser.add_argument("--py-spy", type=float, default=0.0, metavar="S",
                        help="then S seconds of each route at 8 connections under py-spy record "
                        "(every gunicorn worker), and where the workers' CPU goes")  # fmt: skip
    args = parser.parse_args()
    seconds = max(1.0, min(args.duration, 60.0))
    reps = max(1, min(args.reps, 5))
    conn_counts = [max(1, min(int(c), 256)) for c in args.connections.split(",")]
    workers = max(1, min(args.workers, 17))
    if shutil.which("wrk") is None:
        sys.exit("wrk is missing: apt-get install -y wrk")
    benchlib.start_wall_clock(900)

    benchlib.use_database(DB_NAME)
    benchlib.recreate_database()
    benchlib.flush_broker()
    benchlib.setup_django()

    import psycopg
    from django.db import connection

    from accounts.keys import create_api_key
    from endpoints.services import create_endpoint

    endpoint = create_endpoint(
        address=ADDRESS, runner={"kind": "python", "path": "runtime.demo.echo"}
    )
    benchlib.seed_ledger(endpoint.id)
    _, api_key = create_api_key(username="bench-http")
    connection.close()
    db = psycopg.connect(benchlib.DATABASE_URL, autocommit=True)
    db.execute(FLOOR_DDL)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-http-"))
    server = None
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        server = launch_server(port, workers, log_dir)
        wait_server(server, workers)
        warm_routes(url, api_key, workers, ROUTES)
        benchlib.flush_broker()
        db.execute("ANALYZE")
        for rep in range(reps):
            for conns in conn_counts:
                for route in ROUTES:
                    prefix = f"r{rep}-c{conns}-{route}"
                    got = measure_phase(url, server, db, route, conns, seconds, api_key, prefix)
                    results.setdefault((route, conns), []).append(got)
                    print(
                        f"  rep {rep + 1}/{reps} c={conns:<3} {route:<10} "
                        f"{got['per_s']:7.0f}/s  p50 {got['p50_us'] / 1e3:6.1f} ms  "
                        f"p99 {got['p99_us'] / 1e3:6.1f} ms  "
                        f"CPU/req worker {got['worker_cpu_ms']:.2f} ms "
                        f"db {got['backend_cpu_ms']:.2f} ms  errors {got['errors']}",
                        flush=True,
                    )
                benchlib.flush_broker()
        if args.py_spy:
            try:
                spy_routes(
                    url, server.proc.pid, api_key, min(args.py_spy, 60.0), log_dir, args.keep
                )
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                print(f"py-spy: no profile ({exc})", file=sys.stderr)
        server.stop()
        if args.profile:
            profile_routes(api_key, min(args.profile, 5000))
    except BaseException:
        print(f"server log kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.stop()
        db.close()
        benchlib.flush_broker()
        if not args.keep:
            benchlib.drop_database()

    def med(route: str, conns: int, field: str) -> float:
        return benchlib.median([r[field] for r in results[(route, conns)]])

    summary: dict = {"bench": "http", "workers": workers, "seconds": seconds, "reps": reps}
    print(
        f"HTTP admission, gunicorn {workers} sync workers, wrk -t 2, {seconds:g} s per phase, "
        f"median of {reps}:"
    )
    for conns in conn_counts:
        floor_rps = med("floor", conns, "per_s")
        for route in ROUTES:
            rps = med(route, conns, "per_s")
            errors = sum(r["error_total"] for r in results[(route, conns)])
            figures = {
                "per_s": round(rps, 1),
                "p50_ms": round(med(route, conns, "p50_us") / 1e3, 2),
                "p99_ms": round(med(route, conns, "p99_us") / 1e3, 2),
                "errors": errors,
                "ratio_to_floor": round(rps / floor_rps, 3),
                "worker_cpu_ms": round(med(route, conns, "worker_cpu_ms"), 3),
                "backend_cpu_ms": round(med(route, conns, "backend_cpu_ms"), 3),
            }
            summary[f"{route}_c{conns}"] = figures
            print(
                f"  c={conns:<3} {route:<10} {rps:7.0f} req/s  p50 {figures['p50_ms']:6.1f} ms  "
                f"p99 {figures['p99_ms']:6.1f} ms  errors {errors} (all reps)  "
                f"ratio to floor {figures['ratio_to_floor']:.2f}  CPU/req worker "
                f"{figures['worker_cpu_ms']:.2f} ms, db {figures['backend_cpu_ms']:.2f} ms"
            )
    print(json.dumps(summary, separators=(",", ":")))
    if args.keep:
        print(f"server log: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
