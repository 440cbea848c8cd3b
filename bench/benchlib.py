"""What the benchmarks share: the scratch database and broker they own, Django
set-up against them, worker subprocesses, and how figures are summarised.

The benchmarks use only databases named ``claimcheck_bench*`` and Redis db 11
on 127.0.0.1 (``BENCH_DB_SUFFIX`` and ``BENCH_BROKER_URL`` move them): other
engineers run test suites against the other databases and Redis dbs at the
same time, and the benchmarks drop and flush what they use.
admission.py, turns.py and peers.py use ``claimcheck_bench``; a script that
owns another (``use_database``) says so at its top.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Two people benchmarking at once: BENCH_DB_SUFFIX (e.g. "_h12") is appended
# to every scratch database name, BENCH_BROKER_URL replaces Redis db 11.
SUFFIX = os.environ.get("BENCH_DB_SUFFIX", "")
DB_NAME = "claimcheck_bench" + SUFFIX
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
DATABASE_URL = f"{PG_SERVER}/{DB_NAME}"
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
# A hard ceiling for a whole script, whatever happens (a stuck worker, a
# database blocked by someone else's lock): the script stops itself.
WALL_LIMIT_S = 900
# Finished tickets in the ledger before anything is measured (see seed_ledger).
SEED_TICKETS = 20_000


def use_database(name: str) -> None:
    """Point this module (and so the Django set-up and the workers it starts)
    at another scratch database of the bench's own, before anything uses it."""
    global DB_NAME, DATABASE_URL
    assert name.startswith("claimcheck_bench"), name
    DB_NAME = name if name.endswith(SUFFIX) else name + SUFFIX
    DATABASE_URL = f"{PG_SERVER}/{DB_NAME}"


# The fair-share limits (core/fairshare.py) off: the benchmarks drive the
# ledger with one key at full speed. bench/fairshare.py measures the limits
# and sets them itself.
FAIR_SHARE_OFF = {
    "RATE_LIMIT_ADMISSIONS": "",
    "RATE_LIMIT_CONCURRENT_REQUESTS": "0",
    "RATE_LIMIT_CONCURRENT_WAITS": "0",
    "API_WAIT_SLOTS": "1000",
}


def bench_env() -> dict[str, str]:
    """The environment of the bench process and of the workers it starts."""
    env = dict(os.environ)
    # The shells here set PYTHONDONTWRITEBYTECODE: every worker process would
    # then compile Django, Celery and psycopg from source (10 s and more of
    # start-up under load). A deployment runs from bytecode, so let the
    # processes the bench starts write and reuse it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=DATABASE_URL,
        CELERY_BROKER_URL=BROKER_URL,
        PYTHONPATH=str(ROOT),
        C_FORCE_ROOT="1",  # the machine's shells run as root
        # No sweeps run (no beat), but keep the re-dispatch sweep out of the
        # way should someone start one against this database.
        REDISPATCH_AFTER_S="3600",
    )
    # The bench connects directly, as a deployment without a pooler does:
    # the transition functions' calls run prepared (docs/reference/settings.md).
    # BENCH_PREPARED_CALLS=0 measures them as unnamed statements, as behind
    # PgBouncer before 1.21.
    env["DATABASE_PREPARED_CALLS"] = os.environ.get("BENCH_PREPARED_CALLS", "1")
    env.update(FAIR_SHARE_OFF)
    return env


def start_wall_clock(limit_s: float = WALL_LIMIT_S) -> None:
    """SIGALRM ends the script after ``limit_s``; the ``finally`` blocks stop
    the workers it started."""

    def expired(signum, frame):
        raise TimeoutError(f"benchmark exceeded its wall-clock limit of {limit_s:g}s")

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(int(limit_s))


def create_empty_database(name: str) -> None:
    """DROP (FORCE: a worker left over from an interrupted run must not block
    us) and CREATE a scratch database of the bench's own."""
    import psycopg

    assert name.startswith("claimcheck_bench"), name
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")


def drop_database_named(name: str) -> None:
    import psycopg

    assert name.startswith("claimcheck_bench"), name
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def recreate_database() -> None:
    """DROP and CREATE the bench's database (autocommit), then migrate into it."""
    create_empty_database(DB_NAME)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=ROOT,
        env=bench_env(),
        check=True,
    )


def seed_ledger(endpoint_id: int, tickets: int = SEED_TICKETS) -> None:
    """Give the ledger history before anything is measured: ``tickets``
    finished tickets (one event, a turn and a context entry each) on
    ``endpoint_id``, then VACUUM ANALYZE.

    On an empty, never analysed table the planner's estimates are those of a
    tiny table, and they go stale as the benchmark inserts: a statement
    prepared early keeps a generic plan that scans the endpoint's rows
    instead of the unique index, and a lookup by (endpoint, dedupe_key) on an
    endpoint the statistics think empty picks the single-column endpoint
    index and filters every row of the endpoint (see bench/README.md). The
    figures would drift with the run's own inserts; with history on the
    measured endpoint and fresh statistics they measure the steady state.
    """
    import psycopg

    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO tickets_ticket (
                id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state,
                result, artifacts, requester, callback_state, delivery_state,
                obligation_state, obligation_overdue, obligation_note,
                created_at, updated_at, finished_at)
            SELECT gen_random_uuid(), %(endpoint)s, 'seed-' || g, md5(g::text) || md5(g::text),
                jsonb_build_object('seed', g), md5(g::text), 0, 'succeeded',
                jsonb_build_object('ok', true), '[]'::jsonb, '{}'::jsonb, 'none', 'none',
                'none', false, '', now(), now(), now()
            FROM generate_series(1, %(n)s) AS g
            """,
            {"endpoint": endpoint_id, "n": tickets},
        )
        conn.execute(
            """
            INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor,
                detail, at)
            SELECT id, 'admitted', '', 'queued', 'seed', '{}'::jsonb, created_at
            FROM tickets_ticket WHERE endpoint_id = %(endpoint)s
            """,
            {"endpoint": endpoint_id},
        )
        # Their turns and context entries: every turn's statements check
        # foreign keys to runtime_turn, and PostgreSQL keeps the plan of
        # such a check for the life of the connection. Planned on an empty
        # turn table it is a sequential scan, which the workers' long-lived
        # connections (CELERY_DB_REUSE_MAX) then ran over every turn of the
        # run: 5.8 ms per check after 1,000 turns (bench/README.md, round 5).
        conn.execute(
            """
            INSERT INTO runtime_turn (
                id, endpoint_id, ticket_id, seq, state, runner_kind, celery_task_id, worker,
                started_at, heartbeat_at, deadline_at, interrupt_reason, ended_at, token_sha256)
            SELECT gen_random_uuid(), endpoint_id, id,
                row_number() OVER (ORDER BY id), 'completed', 'python', '', '{}'::jsonb,
                created_at, created_at, created_at + interval '1 hour', '', created_at, ''
            FROM tickets_ticket WHERE endpoint_id = %(endpoint)s
            """,
            {"endpoint": endpoint_id},
        )
        conn.execute(
            """
            INSERT INTO runtime_contextentry (
                endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
            SELECT u.endpoint_id, u.id, u.ticket_id, u.seq, t.input, t.result, '[]'::jsonb,
                u.ended_at
            FROM runtime_turn u JOIN tickets_ticket t ON t.id = u.ticket_id
            WHERE u.endpoint_id = %(endpoint)s
            """,
            {"endpoint": endpoint_id},
        )
        conn.execute(
            "UPDATE endpoints_endpoint SET turn_seq = "
            "(SELECT max(seq) FROM runtime_turn WHERE endpoint_id = %(endpoint)s) "
            "WHERE id = %(endpoint)s",
            {"endpoint": endpoint_id},
        )
        conn.execute("VACUUM ANALYZE")


def drop_database() -> None:
    drop_database_named(DB_NAME)


def setup_django() -> None:
    """Point this process at the scratch database and broker, then set Django up."""
    os.environ.update(
        {k: v for k, v in bench_env().items() if k not in ("PYTHONPATH", "C_FORCE_ROOT")}
    )
    import django

    django.setup()


def flush_broker() -> None:
    import redis

    redis.Redis.from_url(BROKER_URL).flushdb()


def broker_depth(queue: str) -> int:
    import redis

    return redis.Redis.from_url(BROKER_URL).llen(queue)


def wait_for(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.02, what: str
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class Proc:
    """A subprocess in its own process group, logging to a file; ready when
    ``marker`` shows up in its log."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        *,
        marker: bytes = b"ready.",
        env: dict[str, str] | None = None,
    ):
        self.name = name
        self.marker = marker
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env or bench_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> bytes:
        return self.log_path.read_bytes()

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log().decode()[-3000:]}")
            return self.marker in self.log()

        wait_for(ready, timeout=timeout, interval=0.1, what=f"{self.name} to be ready")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the whole process group (a warm shutdown for Celery and
        gunicorn); SIGKILL if it lingers."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()


class Worker(Proc):
    """One Celery worker subprocess (prefork pool)."""

    def __init__(self, name: str, app: str, queues: str, concurrency: int, log_dir: Path):
        super().__init__(
            name,
            [
                sys.executable, "-m", "celery", "-A", app, "worker",
                "-Q", queues, "-c", str(concurrency), "-P", "prefork",
                "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "--loglevel", "INFO",
            ],
            log_dir,
        )  # fmt: skip


def cpu_seconds(worker_names: tuple[str, ...] = ()) -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process ("bench"), by
    the bench's workers named ``worker_names`` (every process whose command
    line holds ``<name>@``: the main process and its pool), by PostgreSQL's
    processes and by Redis's. The difference of two snapshots around a phase,
    divided by its work, is what that work costs the machine: it does not
    move with how busy the machine was, as a rate does. PostgreSQL's count
    holds every session of the server's: read it on a quiet machine."""
    import psutil

    me = os.getpid()
    used = dict.fromkeys(("bench", "workers", "postgres", "redis"), 0.0)
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or ())
            if proc.pid == me:
                key = "bench"
            elif any(f"{name}@" in line for name in worker_names):
                key = "workers"
            elif proc.info["name"] == "postgres" or line.startswith("postgres:"):
                key = "postgres"
            elif proc.info["name"] == "redis-server":
                key = "redis"
            else:
                continue
            times = proc.cpu_times()
            used[key] += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return used


def cpu_ms_per_unit(before: dict[str, float], after: dict[str, float], units: int) -> dict:
    """Milliseconds of CPU per unit of work between two ``cpu_seconds``
    snapshots, by part and in total."""
    per = {k: round((after[k] - before[k]) * 1e3 / units, 3) for k in before}
    per["total"] = round(sum(per.values()), 3)
    return per


def median(values: list[float]) -> float:
    return statistics.median(values)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def pin_to_cores(backend_pids: list[int]) -> str:
    """``--pin``: this process on the first core, the PostgreSQL backends of
    its connections on the second. Unpinned, on two cores, a phase's rate
    depended on which phase ran before it: identical admission work measured
    0.72 and 1.00 of its floor in one run, the floor itself 25 % slower
    (bench/README.md, round 8, finding 14): where the scheduler had last put
    the client and its backend. Pinned, the two measured within 3 %. Needs
    two cores and the right to set another process's affinity (root, or
    the PostgreSQL server's user); says what it did either way."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "not pinned: fewer than two cores"
    try:
        for pid in backend_pids:
            os.sched_setaffinity(pid, {cores[1]})
    except OSError as exc:
        return f"not pinned: {exc}"
    os.sched_setaffinity(0, {cores[0]})
    return f"pinned: this process on core {cores[0]}, backends {backend_pids} on core {cores[1]}"


def block_order(groups: list[list[str]], block: int) -> list[str]:
    """The phases of interleaved block number ``block``: the groups rotated
    by one place each block, so every group takes every slot equally often.
    A fixed order charged whatever the first slot costs (the switch from the
    last phase's workload) to the first phase every time: 0.1-0.26 ms per
    admission on this machine (bench/README.md, round 5). A phase that needs
    another's rows (a duplicate of the keys just admitted) follows it inside
    its group."""
    shift = block % len(groups)
    return [phase for group in groups[shift:] + groups[:shift] for phase in group]
