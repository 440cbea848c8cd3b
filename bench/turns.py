"""The no-op turn pipeline: tickets finished per second through a real Celery
worker, against raw Celery no-op tasks through a worker of the same
concurrency on the same broker, measured in the same run.

    .venv/bin/python bench/turns.py [-n 500] [-k 20] [--reps 3] [-c 2] [--profile]

- pipeline: N tickets admitted with ``admit_ticket``, spread round-robin over K
  endpoints whose runner is ``runtime.demo.echo`` (one endpoint runs one
  turn at a time, so K bounds the parallelism), consumed by
  ``celery -A config worker -Q turns,control -c C``. The clock runs from just
  before the first admission to the latest ``finished_at`` of the N tickets;
  the bench polls the database until all are terminal (with a deadline).
- isolated: the same N tickets on K endpoints whose echo runs
  ``"isolation": "process"`` (each slot's warm turn process), in the same
  run: the per-turn cost of process isolation against the inline pipeline.
- isolated in this process: turns run one after another in the bench's own
  process (no admission, broker or pool in the clock), an inline and a
  process-isolated echo endpoint alternating in blocks (``--iso-turns`` per
  block): the worker's own cost of a turn in each mode, side by side. The
  pipeline figure above is bounded by admission on a loaded machine; this
  one is not.
- floor: N ``bench.noop`` tasks (bench/noop_app.py: its own Celery app, no
  Django) published to the same Redis db and consumed by
  ``celery -A bench.noop_app worker -Q bench_noop -c C``; the clock runs
  from just before the first publish to the moment the N-th task finished.

Both workers stay up for the whole run (idle, each costs nothing but a
blocking BRPOP) and the repetitions alternate pipeline and floor, so both see
the same background load on this shared machine. A figure is the median over
repetitions; the ratio is pipeline / floor.

Each pipeline round also reads the CPU it cost the machine per ticket, from
admission to finish: this process (admission), the turns worker, PostgreSQL,
Redis (benchlib.cpu_seconds): a figure that does not move with how busy the
machine is, as a rate does, and says which part a change made dearer.

The run also counts the database round trips of one turn (run in this
process, publishing off), and of a turn of a backlog one task runs in this
process as a worker's task does (each finish starting the next turn,
``--backlog-turns``), and with ``--profile`` prints the statements and a
cProfile of a few turns.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

# Run as a script, Python puts bench/ first on sys.path, where bench/http.py
# would shadow the standard library's ``http``: import from the repository root.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

PROBE = "bench.turns-probe"
# The same probe, process-isolated (isolated vs inline in this process).
PROBE_ISO = "bench.turns-probe-iso"
# A backlog on one endpoint, and turns on another beside it.
HOT, QUIET = "bench.turns-hot", "bench.turns-quiet"
# A backlog one task runs in this process.
BACKLOG = "bench.turns-backlog"


def endpoint_address(i: int, isolated: bool = False) -> str:
    return f"bench.{'iso' if isolated else 'turns'}-{i:03d}"


def pipeline_round(tag: str, n: int, k: int, timeout: float, isolated: bool = False) -> dict:
    """Admit N tickets over K endpoints; wait until all are terminal."""
    from django.db.models import Max
    from django.utils import timezone

    from tickets.admission import admit_ticket
    from tickets.models import TERMINAL_STATES, Ticket

    cpu_before = benchlib.cpu_seconds(("bench-turns",))
    started_at = timezone.now()
    clock = time.perf_counter()
    ids = []
    for i in range(n):
        admitted = admit_ticket(
            endpoint=endpoint_address(i % k, isolated), input={"i": i}, dedupe_key=f"{tag}-{i}"
        )
        ids.append(admitted.ticket.id)
    admit_s = time.perf_counter() - clock
    # The finish time comes from the tickets' own finished_at: the poll
    # interval only decides when we look, not what we measure.
    benchlib.wait_for(
        lambda: Ticket.objects.filter(id__in=ids, state__in=TERMINAL_STATES).count() == n,
        timeout=timeout,
        interval=0.25,
        what=f"{n} tickets ({tag}) to be terminal",
    )
    cpu = benchlib.cpu_ms_per_unit(cpu_before, benchlib.cpu_seconds(("bench-turns",)), n)
    finished_at = Ticket.objects.filter(id__in=ids).aggregate(end=Max("finished_at"))["end"]
    states = Counter(Ticket.objects.filter(id__in=ids).values_list("state", flat=True))
    seconds = (finished_at - started_at).total_seconds()
    return {"seconds": seconds, "per_s": benchlib.rate(n, seconds), "admit_s": admit_s,
            "states": dict(states), "cpu_ms": cpu}  # fmt: skip


def dispatch_latency(count: int, timeout: float) -> dict:
    """Dispatch latency on an idle pipeline: one ticket at a time, from the
    moment admission begins (so the admission statement and its commit are
    included) to the turn's ``started_at`` (read by the worker once it holds
    the lock). The path: NOTIFY at commit -> the control worker's dispatcher
    thread wakes, unmarks, publishes -> a pool process takes the message and
    starts the turn. Each ticket is waited on until terminal before the next."""
    from django.utils import timezone

    from tickets.admission import admit_ticket
    from tickets.models import TERMINAL_STATES, Ticket, Turn

    samples = []
    for i in range(count):
        before = timezone.now()
        ticket_id = admit_ticket(
            endpoint=endpoint_address(0), input={"lat": i}, dedupe_key=f"lat-{i}"
        ).ticket.id
        benchlib.wait_for(
            lambda t=ticket_id: Ticket.objects.filter(id=t, state__in=TERMINAL_STATES).exists(),
            timeout=timeout,
            interval=0.005,
            what="a latency probe to finish",
        )
        started = Turn.objects.get(ticket_id=ticket_id).started_at
        samples.append((started - before).total_seconds() * 1e3)
    samples.sort()
    return {
        "p50_ms": round(samples[len(samples) // 2], 2),
        "p90_ms": round(samples[int(len(samples) * 0.9)], 2),
        "max_ms": round(samples[-1], 2),
        "count": count,
    }


def floor_round(n: int, timeout: float) -> dict:
    """Publish N no-op tasks; wait for the N-th to finish."""
    import redis

    from bench import noop_app

    r = redis.Redis.from_url(benchlib.BROKER_URL)
    r.delete(noop_app.DONE_KEY, noop_app.FINISHED_KEY)
    started_at = time.time()
    clock = time.perf_counter()
    for _ in range(n):
        noop_app.app.send_task("bench.noop", args=[n], queue=noop_app.QUEUE)
    publish_s = time.perf_counter() - clock
    finished = benchlib.wait_for(
        lambda: r.get(noop_app.FINISHED_KEY),
        timeout=timeout,
        interval=0.25,
        what=f"{n} no-op tasks to finish",
    )
    done = int(r.get(noop_app.DONE_KEY))
    assert done == n, f"{done} no-op tasks ran, expected {n}"
    seconds = float(finished) - started_at
    return {"seconds": seconds, "per_s": benchlib.rate(n, seconds), "publish_s": publish_s}


@contextmanager
def quiet_logs():
    """The runtime's per-turn INFO lines stay out of the bench's output."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


class _DbClock:
    """Time spent in SQL statements (an execute wrapper) and in COMMIT (which
    Django sends through ``connection.commit``, not a cursor)."""

    def __init__(self, connection):
        self.statements = self.statement_s = self.commits = self.commit_s = 0
        self._commit = connection.commit

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.statement_s += time.perf_counter() - started
            self.statements += 1

    def commit(self):
        started = time.perf_counter()
        try:
            return self._commit()
        finally:
            self.commit_s += time.perf_counter() - started
            self.commits += 1


def probe_turns(
    turns: int = 30, *, show: bool = False, endpoint: str = PROBE, tag: str = "probe"
) -> dict:
    """Run ``turns`` turns one after another in this process (publishing off,
    on an endpoint the worker never hears of): where a turn's time goes, and
    the statements of the last one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from config.celery import app
    from runtime.turns import run_ticket
    from tickets.admission import admit_ticket

    with mock.patch.object(app, "send_task", lambda *a, **kw: None), quiet_logs():
        ids = [
            admit_ticket(endpoint=endpoint, input={"i": i}, dedupe_key=f"{tag}-{i}").ticket.id
            for i in range(turns)
        ]
        run_ticket(ticket_id=ids[0], celery_task_id=str(uuid.uuid4()))  # warm
        with _measured(connection, turns - 2) as m:
            for ticket_id in ids[1:-1]:
                run_ticket(ticket_id=ticket_id, celery_task_id=str(uuid.uuid4()))
        clock, wall, cpu = m.clock, m.wall / (turns - 2), m.cpu
        with CaptureQueriesContext(connection) as captured:
            run_ticket(ticket_id=ids[-1], celery_task_id=str(uuid.uuid4()))
    sqls = [q["sql"] for q in captured.captured_queries]
    if show:
        print(f"--- statements of one turn ({len(sqls)}) ---")
        for sql in sqls:
            print("  " + " ".join(sql.split())[:150])
    per = turns - 2
    return {
        "statements": len(sqls),
        "savepoint_statements": sum(1 for s in sqls if "SAVEPOINT" in s),
        "turn_ms": round(wall * 1e3, 2),
        "in_statements_ms": round(clock.statement_s / per * 1e3, 2),
        "in_commit_ms": round(clock.commit_s / per * 1e3, 2),
        "commits": round(clock.commits / per, 1),
        "cpu_ms": cpu,
    }


class _Measured:
    clock: _DbClock
    wall: float = 0.0  # seconds
    cpu: dict[str, float] | None = None  # ms per turn: this process ("worker"), PostgreSQL


@contextmanager
def _measured(connection, turns: int):
    """The block's SQL statements and COMMITs (``_DbClock``), its wall time,
    and the CPU per turn of this process (the worker's part) and of
    PostgreSQL: what a turn costs, whatever else the machine did."""
    m = _Measured()
    m.clock = _DbClock(connection)
    cpu = benchlib.cpu_seconds()
    started = time.perf_counter()
    with (
        connection.execute_wrapper(m.clock),
        mock.patch.object(connection, "commit", m.clock.commit),
    ):
        yield m
    m.wall = time.perf_counter() - started
    per = benchlib.cpu_ms_per_unit(cpu, benchlib.cpu_seconds(), turns)
    m.cpu = {"worker": per["bench"], "postgres": per["postgres"]}


def probe_backlog(turns: int, tag: str = "backlog") -> dict:
    """A backlog of ``turns`` tickets on one endpoint, run by one task in this
    process as a worker's task runs it (``keep_going``: each finish starts
    the next turn), publishing off: ms, statements and COMMITs per turn."""
    from django.db import connection
    from django.test.utils import override_settings

    from config.celery import app
    from runtime.turns import run_ticket
    from tickets.admission import admit_ticket
    from tickets.models import Ticket

    with (
        mock.patch.object(app, "send_task", lambda *a, **kw: None),
        quiet_logs(),
        override_settings(TURN_CHAIN_MAX=turns + 1, TURN_CHAIN_WINDOW_S=3600.0),
    ):
        ids = [
            admit_ticket(endpoint=BACKLOG, input={"i": i}, dedupe_key=f"{tag}-{i}").ticket.id
            for i in range(turns)
        ]
        with _measured(connection, turns) as m:
            run_ticket(ticket_id=ids[0], celery_task_id=str(uuid.uuid4()), keep_going=lambda: True)
        clock, wall, cpu = m.clock, m.wall, m.cpu
    done = Ticket.objects.filter(id__in=ids, state="succeeded").count()
    if done != turns:
        raise SystemExit(f"the backlog probe finished {done} of {turns} tickets")
    return {
        "turns": turns,
        "turn_ms": round(wall / turns * 1e3, 2),
        "statements": round(clock.statements / turns, 2),
        "in_statements_ms": round(clock.statement_s / turns * 1e3, 2),
        "commits": round(clock.commits / turns, 2),
        "cpu_ms": cpu,
    }


def probe_isolation(turns: int, blocks: int = 4) -> dict:
    """Turns one after another in this process (publishing off), blocks of
    ``turns`` on the inline probe and on the isolated one alternating (which
    goes first alternates too), so both see the same background load: ms of
    this process per turn in each mode."""
    from config.celery import app
    from runtime.turns import run_ticket
    from tickets.admission import admit_ticket

    spent = {PROBE: 0.0, PROBE_ISO: 0.0}
    with mock.patch.object(app, "send_task", lambda *a, **kw: None), quiet_logs():
        ids = {
            ep: [
                admit_ticket(endpoint=ep, input={"i": i}, dedupe_key=f"iso-{ep}-{i}").ticket.id
                for i in range(turns * blocks + 1)
            ]
            for ep in spent
        }
        for ep in spent:  # warm: the isolated probe's process is forked here
            run_ticket(ticket_id=ids[ep][0], celery_task_id=str(uuid.uuid4()))
        for block in range(blocks):
            order = [PROBE, PROBE_ISO] if block % 2 == 0 else [PROBE_ISO, PROBE]
            for ep in order:
                started = time.perf_counter()
                for ticket_id in ids[ep][1 + block * turns : 1 + (block + 1) * turns]:
                    run_ticket(ticket_id=ticket_id, celery_task_id=str(uuid.uuid4()))
                spent[ep] += time.perf_counter() - started
    inline_ms = spent[PROBE] / (turns * blocks) * 1e3
    isolated_ms = spent[PROBE_ISO] / (turns * blocks) * 1e3
    return {
        "turns": turns * blocks,
        "inline_ms": round(inline_ms, 2),
        "isolated_ms": round(isolated_ms, 2),
        "ratio": round(inline_ms / isolated_ms, 3),
    }


def probe_beside_backlog(backlog: int) -> dict:
    """Turns on a quiet endpoint while another holds ``backlog`` queued
    tickets, admitted after the statistics were taken (as between two
    ANALYZEs): a turn that found its next ticket through an index of every
    endpoint's queue read the whole backlog twice."""
    from config.celery import app
    from tickets.admission import admit_ticket

    with mock.patch.object(app, "send_task", lambda *a, **kw: None), quiet_logs():
        for i in range(backlog):
            admit_ticket(endpoint=HOT, input={"i": i}, dedupe_key=f"hot-{i}")
    return probe_turns(endpoint=QUIET, tag="quiet")


def profile_turns(count: int) -> None:
    from config.celery import app
    from runtime.turns import run_ticket
    from tickets.admission import admit_ticket

    with mock.patch.object(app, "send_task", lambda *a, **kw: None), quiet_logs():
        ids = [
            admit_ticket(endpoint=PROBE, input={"i": i}, dedupe_key=f"prof-{i}").ticket.id
            for i in range(count)
        ]
        prof = cProfile.Profile()
        clock = time.perf_counter()
        prof.runcall(lambda: [run_ticket(ticket_id=t, celery_task_id="prof") for t in ids])
        seconds = time.perf_counter() - clock
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
    print(f"--- cProfile: {count} turns in this process, {seconds / count * 1e3:.1f} ms each ---")
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="tickets (and no-op tasks) per rep")
    parser.add_argument("-k", type=int, default=20, help="endpoints the tickets spread over")
    parser.add_argument("-c", "--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (<= 7)")
    parser.add_argument("--timeout", type=float, default=150.0, help="deadline per round, s")
    parser.add_argument("--profile", action="store_true", help="print a turn's SQL and cProfile")
    parser.add_argument("--latency-probes", type=int, default=40, help="dispatch latency samples")
    parser.add_argument("--backlog", type=int, default=5000, help="queued beside the last probe")
    parser.add_argument(
        "--backlog-turns", type=int, default=200, help="one endpoint's backlog one task runs"
    )
    parser.add_argument("--iso-turns", type=int, default=50, help="in-process turns per block")
    parser.add_argument("--keep", action="store_true", help="keep claimcheck_bench afterwards")
    args = parser.parse_args()
    n, k, reps = min(args.n, 5000), max(1, min(args.k, 200)), min(args.reps, 7)
    conc = max(1, min(args.concurrency, 8))
    # Another scratch database / Redis db, so two benches on one machine do not collide.
    if os.environ.get("BENCH_DB"):
        benchlib.use_database(os.environ["BENCH_DB"])
    benchlib.BROKER_URL = os.environ.get("BENCH_BROKER_URL", benchlib.BROKER_URL)
    benchlib.start_wall_clock()

    benchlib.recreate_database()
    benchlib.flush_broker()
    benchlib.setup_django()

    from django.db import connection

    from endpoints.services import create_endpoint

    # The pipeline runs inline (the floor of the runtime itself); the same
    # tickets on process-isolated endpoints show what isolation costs.
    runner = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}
    isolated = {"kind": "python", "path": "runtime.demo.echo", "isolation": "process"}
    for i in range(k):
        create_endpoint(address=endpoint_address(i), runner=runner)
        create_endpoint(address=endpoint_address(i, True), runner=isolated)
    for address in (PROBE, HOT, QUIET, BACKLOG):
        create_endpoint(address=address, runner=runner)
    create_endpoint(address=PROBE_ISO, runner=isolated)
    # History on an endpoint of its own: the turn's queries go by ticket id,
    # lock row and the partial queued index, not by how many tickets exist.
    benchlib.seed_ledger(create_endpoint(address="bench.seed", runner=runner).id)

    log_dir = Path(tempfile.mkdtemp(prefix="claimcheck-bench-turns-"))
    workers: list[benchlib.Worker] = []
    pipeline: list[dict] = []
    floor: list[dict] = []
    iso: list[dict] = []
    try:
        workers.append(benchlib.Worker("bench-turns", "config", "turns,control", conc, log_dir))
        workers.append(benchlib.Worker("bench-noop", "bench.noop_app", "bench_noop", conc, log_dir))
        for w in workers:
            w.wait_ready()
        # Warm up: every pool process imports, connects and runs a few tasks.
        pipeline_round("warm", 2 * k, k, args.timeout)
        pipeline_round("warm-iso", 2 * k, k, args.timeout, isolated=True)
        floor_round(4 * conc, args.timeout)
        for rep in range(reps):
            pipeline.append(pipeline_round(f"r{rep}", n, k, args.timeout))
            floor.append(floor_round(n, args.timeout))
            iso.append(pipeline_round(f"i{rep}", n, k, args.timeout, isolated=True))
            p, f = pipeline[-1], floor[-1]
            print(
                f"  rep {rep + 1}/{reps}: pipeline {p['per_s']:.0f} tickets/s "
                f"({p['seconds']:.2f}s, admitting took {p['admit_s']:.2f}s, {p['states']})  "
                f"floor {f['per_s']:.0f} tasks/s ({f['seconds']:.2f}s, "
                f"publishing took {f['publish_s']:.2f}s)  ratio {p['per_s'] / f['per_s']:.2f}  "
                f"isolated {iso[-1]['per_s']:.0f} tickets/s ({iso[-1]['states']})",
                flush=True,
            )
        time.sleep(1.0)  # let the pipeline go idle
        latency = dispatch_latency(args.latency_probes, args.timeout)
        print(
            f"  dispatch latency (admission -> turn started, idle, {latency['count']} probes): "
            f"p50 {latency['p50_ms']:.1f} ms  p90 {latency['p90_ms']:.1f} ms  "
            f"max {latency['max_ms']:.1f} ms",
            flush=True,
        )
    except BaseException:
        print(f"worker logs kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        for w in workers:
            w.stop()
        # Dispatch messages the worker took per ticket: the admission's, plus
        # the one ``dispatch_next`` publishes when a turn releases the lock.
        received = workers[0].log().count(b"] received") if workers else 0
        benchlib.flush_broker()
    try:
        # With the workers gone: no dispatcher publishes the probe's tickets.
        queries = probe_turns(show=args.profile)
        backlog = probe_backlog(max(10, args.backlog_turns))
        beside = probe_beside_backlog(min(args.backlog, 50_000))
        in_process = probe_isolation(max(1, min(args.iso_turns, 1000)))
        if args.profile:
            profile_turns(50)
    finally:
        connection.close()
        if not args.keep:
            benchlib.drop_database()

    tickets_total = 4 * k + n * (len(pipeline) + len(iso))
    messages_per_ticket = round(received / tickets_total, 2)
    failed = 0
    for p in pipeline + iso:
        failed += sum(c for s, c in p["states"].items() if s != "succeeded")
    med_p = benchlib.median([p["per_s"] for p in pipeline])
    med_f = benchlib.median([f["per_s"] for f in floor])
    ratio = round(med_p / med_f, 3)
    med_i = benchlib.median([i["per_s"] for i in iso])
    iso_ratio = round(med_i / med_p, 3)
    fork_ms = 1e3 * conc * (1 / med_i - 1 / med_p)
    print(
        f"turns (no-op echo, {k} endpoints, -c {conc}): {med_p:.0f} tickets/s  "
        f"raw Celery no-op floor: {med_f:.0f} tasks/s  ratio {ratio:.2f}"
    )
    print(
        f"per ticket: {1e3 * conc / med_p:.1f} ms of a worker process vs "
        f"{1e3 * conc / med_f:.1f} ms per no-op task; "
        f"one turn runs {queries['statements']} SQL statements "
        f"({queries['savepoint_statements']} of them SAVEPOINT/RELEASE); "
        f"the worker took {messages_per_ticket} dispatch messages per ticket"
    )
    cpu = {
        part: round(benchlib.median([p["cpu_ms"][part] for p in pipeline]), 2)
        for part in pipeline[0]["cpu_ms"]
    }
    print(
        f"CPU per ticket, admission to finish (median of the repetitions): "
        f"{cpu['total']:.2f} ms: PostgreSQL {cpu['postgres']:.2f}, the worker "
        f"{cpu['workers']:.2f}, admission in this process {cpu['bench']:.2f}, "
        f"Redis {cpu['redis']:.2f}"
    )
    print(
        f"one turn in this process: {queries['turn_ms']:.1f} ms, of which "
        f"{queries['in_statements_ms']:.1f} ms waiting on SQL statements and "
        f"{queries['in_commit_ms']:.1f} ms on {queries['commits']:g} COMMITs; the rest is Python"
    )
    print(
        f"a backlog of {backlog['turns']} run by one task in this process: "
        f"{backlog['turn_ms']:.1f} ms per turn ({backlog['turn_ms'] / queries['turn_ms']:.2f}x "
        f"the turn above), {backlog['statements']:g} statements per turn, "
        f"{backlog['in_statements_ms']:.1f} ms of it in SQL; CPU per turn: this process "
        f"{backlog['cpu_ms']['worker']:.2f} ms, PostgreSQL {backlog['cpu_ms']['postgres']:.2f} ms "
        f"(one turn above: {queries['cpu_ms']['worker']:.2f}, {queries['cpu_ms']['postgres']:.2f})"
    )
    print(
        f"one turn beside another endpoint's backlog of {args.backlog:,}: "
        f"{beside['turn_ms']:.1f} ms ({beside['turn_ms'] / queries['turn_ms']:.2f}x the turn "
        f"above), {beside['in_statements_ms']:.1f} ms of it in SQL"
    )
    print(
        f"dispatch latency p50 {latency['p50_ms']:.1f} ms (target < 20 ms idle), "
        f"p90 {latency['p90_ms']:.1f} ms"
    )
    print(
        f"isolated turns (the same {k} endpoints' worth): {med_i:.0f} tickets/s  "
        f"inline: {med_p:.0f} tickets/s  ratio isolated/inline {iso_ratio:.2f}  "
        f"(process isolation costs {fork_ms:.1f} ms of a worker process per turn)"
    )
    print(
        f"isolated vs inline in this process ({in_process['turns']} turns each, alternating "
        f"blocks): {in_process['isolated_ms']:.2f} ms vs {in_process['inline_ms']:.2f} ms "
        f"per turn  ratio isolated/inline {in_process['ratio']:.2f}"
    )
    if failed:
        print(f"WARNING: {failed} ticket(s) did not succeed")
    summary = {
        "bench": "turns",
        "n": n,
        "endpoints": k,
        "concurrency": conc,
        "reps": reps,
        "per_s": {"pipeline": round(med_p, 1), "floor": round(med_f, 1)},
        "per_s_runs": {
            "pipeline": [round(p["per_s"], 1) for p in pipeline],
            "floor": [round(f["per_s"], 1) for f in floor],
        },
        "ratio": ratio,
        "cpu_ms_per_ticket": cpu,
        "cpu_ms_per_ticket_runs": [p["cpu_ms"] for p in pipeline],
        "isolated": {
            "per_s": round(med_i, 1),
            "per_s_runs": [round(i["per_s"], 1) for i in iso],
            "ratio_to_inline": iso_ratio,
            "overhead_ms_per_turn": round(fork_ms, 1),
            "in_process": in_process,
        },
        "turn_queries": queries,
        "beside_backlog": {"backlog": args.backlog, **beside},
        "backlog_in_process": backlog,
        "messages_per_ticket": messages_per_ticket,
        "dispatch_latency": latency,
        "not_succeeded": failed,
    }
    print(json.dumps(summary, separators=(",", ":")))
    if args.keep:
        print(f"worker logs: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
