"""Fault tests: real processes against a private PostgreSQL and Redis that the
tests stop, restart and kill. Each fault measures what the runtime promises
(nothing lost, nothing run twice, clear answers while a service is down) and
ends with the ledger audit.

`make test` runs the reduced set; `make faults` the full one (FAULTS_FULL=1:
more kills, every sweep process separately).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter

import httpx
import pytest

from .figures import FULL
from .stack import Load, Stack, figures, unfinished, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.integration]

# A turn's heartbeat is awaited this long before the sweep interrupts it:
# wide enough that a loaded 2-core machine never misses one by accident.
HEARTBEAT_TIMEOUT_S = 6
GRACE_S = 3


def assert_audit_clean(stack: Stack) -> dict:
    report = stack.audit()
    assert report["ok"], f"audit_ledger found violations: {report['counts']}\n" + "\n".join(
        f"{v['kind']} {v['ids']}: {v['detail']}" for v in report["violations"][:20]
    )
    return report


def decide_finalize(stack: Stack, case_id: str) -> None:
    """The owner's decision that frees a quarantined endpoint: inspect, then
    finalize the uncertain ticket as orphaned (nothing is re-run)."""
    inspection = stack.http.post(f"/api/v1/recovery/cases/{case_id}/inspections")
    assert inspection.status_code == 201, inspection.text
    decided = stack.http.post(
        f"/api/v1/recovery/cases/{case_id}/decisions",
        json={
            "action": "finalize_orphan",
            "inspection": inspection.json()["id"],
            "rationale": "fault test: the worker was killed; its work is not repeated",
        },
    )
    assert decided.status_code == 201, decided.text


# --- Concurrent admissions with one key --------------------------------------------------------


@pytest.mark.timeout(300)
def test_concurrent_admissions_with_one_key_make_one_ticket(stack, record_figures):
    """500 concurrent admissions with one key and one input: one ticket, 500
    answers naming it (one 201). Then 50 with that key and other inputs:
    50 x 409 ``dedupe_conflict`` naming it, and no new row. The reduced set
    (`make test`) sends 100 and 20: the same race on the same unique index,
    at a fifth of the threads (a 500-thread burst was a minute of the
    suite's CPU)."""
    same_n, other_n = (500, 50) if FULL else (100, 20)
    stack.create_endpoint("dup.ep")
    key = "one-key"

    def burst(bodies: list[dict]) -> list[httpx.Response | Exception]:
        out: list[httpx.Response | Exception] = [None] * len(bodies)  # type: ignore[list-item]
        gate = threading.Barrier(len(bodies))

        def send(i: int) -> None:
            # A client (one connection) per thread: 500 threads sharing one
            # httpx pool once lost a socket to a client-side race (EBADF).
            # Plain HTTP: verify=False spares each client loading the CA
            # bundle into a TLS context it would never use.
            with httpx.Client(
                base_url=stack.base_url,
                headers={"Authorization": f"Bearer {stack.cluster.staff_key}"},
                timeout=60,
                verify=False,
            ) as client:
                gate.wait()
                try:
                    out[i] = client.post("/api/v1/tickets", json=bodies[i])
                except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                    out[i] = exc

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        return out

    same = {"endpoint": "dup.ep", "dedupe_key": key, "input": {"seconds": 0.1}}
    t0 = time.monotonic()
    first = burst([same] * same_n)
    first_s = time.monotonic() - t0
    errors = [r for r in first if not isinstance(r, httpx.Response)]
    assert not errors, errors[:3]
    statuses = Counter(r.status_code for r in first)
    ids = {r.json().get("id") for r in first}
    rows_before = stack.sql("SELECT count(*) FROM tickets_ticket")[0][0]
    with_key = stack.sql("SELECT id::text FROM tickets_ticket WHERE dedupe_key = %s", [key])

    conflicting = burst([{**same, "input": {"seconds": 0.1, "variant": i}} for i in range(other_n)])
    errors = [r for r in conflicting if not isinstance(r, httpx.Response)]
    assert not errors, errors[:3]
    conflict_statuses = Counter(r.status_code for r in conflicting)
    conflict_tickets = {r.json().get("ticket") for r in conflicting}
    rows_after = stack.sql("SELECT count(*) FROM tickets_ticket")[0][0]
    (ticket,) = ids
    assert not (problem := unfinished({ticket}, stack.wait_terminal({ticket}, timeout=60))), problem
    report = stack.audit()
    record_figures(
        figures(
            "concurrent_same_key",
            stack,
            None,
            acknowledged={ticket},
            audit=report,
            same_input={
                "requests": same_n,
                "responses": dict(statuses),
                "ids": len(ids),
                "seconds": round(first_s, 1),
            },  # fmt: skip
            different_input={
                "requests": other_n,
                "responses": dict(conflict_statuses),
                "new_rows": rows_after - rows_before,
            },  # fmt: skip
        )
    )
    assert statuses == {201: 1, 200: same_n - 1}, statuses
    assert len(ids) == 1 and [r[0] for r in with_key] == [ticket]
    assert conflict_statuses == {409: other_n}, conflict_statuses
    assert {r.json()["error"] for r in conflicting} == {"dedupe_conflict"}
    assert conflict_tickets == {ticket}
    assert rows_after == rows_before
    assert stack.executions()[ticket] == 1
    assert_audit_clean(stack)


# --- Workers killed mid-turn -------------------------------------------------------------------


@pytest.mark.timeout(1200 if FULL else 400)
def test_sigkill_of_a_turns_worker_mid_turn_replays_nothing(stack, record_figures):
    """SIGKILL a turns worker (main process and pool) while it runs turns, N
    times under load. No ticket runs twice; each killed turn's endpoint is
    quarantined with exactly one case (the owner then finalizes it); every
    other ticket completes."""
    kills = 10 if FULL else 2
    endpoints = [f"kill.ep-{i}" for i in range(6)]
    for address in endpoints:
        stack.create_endpoint(
            address, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, interrupt_grace_s=GRACE_S
        )
    # 1.5 s turns: long enough that the kill still finds the turn it saw
    # running after the few round trips between (on a loaded machine those
    # took more than the half second turns used to last), short enough for
    # the backlog behind a quarantine to drain quickly.
    load = Load(stack, endpoints, input={"seconds": 1.5}, threads=2, pause_s=0.3, prefix="kill")
    load.start()
    killed: dict[str, dict] = {}  # turn id -> {ticket, endpoint, case}
    quarantine_s: list[float] = []
    try:
        for i in range(kills):
            victim = ("turns", "turns-b")[i % 2]
            stack.wait_ready(victim)  # restarted two kills ago

            def running_on_victim(victim=victim):
                pids = stack.pids(victim)
                rows = stack.sql(
                    "SELECT id::text FROM runtime_turn WHERE state = 'running' "
                    "AND (worker->>'pid')::int = ANY(%s) "
                    "AND started_at < now() - interval '200 milliseconds'",
                    [list(pids)],
                )
                return (pids, rows) if rows else None

            pids, _ = wait_until(
                running_on_victim, timeout=60, what=f"{victim} to be in the middle of a turn"
            )
            (killed_at,) = stack.sql("SELECT now()")[0]
            sessions = stack.db_sessions(victim)
            stack.kill(victim, signal.SIGKILL)
            stack.sessions_ended(sessions, f"{victim}'s database sessions to end")
            rows = stack.sql(
                "SELECT t.id::text, t.ticket_id::text, e.address FROM runtime_turn t "
                "JOIN endpoints_endpoint e ON e.id = t.endpoint_id "
                "WHERE t.state IN ('running', 'interrupting') "
                "AND (t.worker->>'pid')::int = ANY(%s)",
                [list(pids)],
            )
            assert rows, "the kill should have caught at least one turn running"
            stack.respawn(victim)  # ready by the time it is the victim again

            def all_quarantined(rows=rows):
                cases = dict(
                    stack.sql(
                        "SELECT turn_id::text, id::text FROM recovery_recoverycase "
                        "WHERE turn_id = ANY(%s::uuid[]) AND state = 'open'",
                        [[r[0] for r in rows]],
                    )
                )
                return cases if len(cases) == len(rows) else None

            cases = wait_until(
                all_quarantined, timeout=90, what="every killed turn to be quarantined"
            )
            (opened,) = stack.sql(
                "SELECT max(opened_at) FROM recovery_recoverycase WHERE id = ANY(%s::uuid[])",
                [list(cases.values())],
            )[0]
            quarantine_s.append((opened - killed_at).total_seconds())
            for turn, ticket, address in rows:
                (state,) = stack.sql(
                    "SELECT state FROM endpoints_endpoint WHERE address = %s", [address]
                )[0]
                assert state == "quarantined"
                open_cases = stack.sql(
                    "SELECT count(*) FROM recovery_recoverycase c JOIN endpoints_endpoint e "
                    "ON e.id = c.endpoint_id WHERE e.address = %s AND c.state = 'open'",
                    [address],
                )[0][0]
                assert open_cases == 1, f"{address} has {open_cases} open cases"
                killed[turn] = {"ticket": ticket, "endpoint": address, "case": cases[turn]}
            for turn, _, _ in rows:
                decide_finalize(stack, killed[turn]["case"])
    finally:
        load.stop()

    acknowledged = load.acknowledged
    drain = time.monotonic()
    states = stack.wait_terminal(acknowledged, timeout=60)
    drain_s = round(time.monotonic() - drain, 1)
    killed_tickets = {k["ticket"] for k in killed.values()}
    replays = stack.replays()
    cases = stack.sql(
        "SELECT c.turn_id::text FROM recovery_recoverycase c JOIN endpoints_endpoint e "
        "ON e.id = c.endpoint_id WHERE e.address LIKE 'kill.%%'"
    )
    report = stack.audit()
    record_figures(
        figures(
            "sigkill_turns_worker",
            stack,
            load,
            audit=report,
            seconds_to_finish_after_load=drain_s,
            kills=kills,
            killed_turns=len(killed),
            quarantined_endpoints=len({k["endpoint"] for k in killed.values()}),
            cases=len(cases),
            seconds_kill_to_quarantine=[round(s, 1) for s in quarantine_s],
        )
    )
    assert not (problem := unfinished(acknowledged, states)), problem
    assert replays == {}, f"tickets run twice: {replays}"
    assert {c[0] for c in cases} == set(killed), "a case for a turn that was not killed"
    assert all(states[t] == "orphaned" for t in killed_tickets & set(states))
    others = {i: s for i, s in states.items() if i not in killed_tickets}
    assert Counter(others.values()) == {"succeeded": len(others)}, Counter(others.values())
    # Admissions to an endpoint while it is quarantined are refused (423); a
    # same-key retry after a transport error finds its ticket (200).
    assert set(load.statuses()) <= {"201", "423", "200"}, load.statuses()
    assert all(r.retried for r in load.results if r.status == 200), "a 200 for a new key"
    assert {r.code for r in load.results if r.status == 423} <= {"endpoint_quarantined"}
    assert_audit_clean(stack)


# --- Redis stopped under load --------------------------------------------------------------


@pytest.mark.timeout(400)
def test_redis_down_for_ten_seconds_loses_nothing(stack, record_figures):
    """Stop the broker for 10 s during steady admissions and turns, and
    start it again empty. Every admission answers in time, as the contract
    says (201, or 503 ``unavailable``; never 500); every process is still
    running afterwards (a turns worker started without the gossip and mingle
    flags included); every acknowledged ticket exists afterwards and
    finishes, none twice."""
    endpoints = [f"redis.ep-{i}" for i in range(4)]
    for address in endpoints:
        stack.create_endpoint(
            address, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, interrupt_grace_s=GRACE_S
        )
    load = Load(stack, endpoints, threads=2, pause_s=0.25, timeout_s=20, prefix="redis").start()
    try:
        load.wait_for_count(10)
        load.mark("down")
        stack.redis.stop()
        time.sleep(10)  # the behaviour under test: the broker down for 10 s under load
        stack.redis.start()
        load.mark("up")
        time.sleep(6)  # the behaviour under test: the load goes on after the broker is back
    finally:
        load.stop()
    acknowledged = load.acknowledged
    drain = time.monotonic()
    states = stack.wait_terminal(acknowledged, timeout=60)
    drain_s = round(time.monotonic() - drain, 1)
    during = load.statuses(load.marks["down"], load.marks["up"])
    # Every process outlived the broker's restart (empty: no persistence).
    # A worker's gossip step fails when its consumer restarts on a lost
    # connection (celery/kombu#582: logged "Error on restarting Gossip", or
    # "Unrecoverable error" and the worker exits); ``turns-b`` is started
    # without the flags that turn gossip off, so config/celery.py must.
    exited = {
        name: proc.returncode for name, proc in stack.procs.items() if proc.poll() is not None
    }
    unrecoverable = [
        name
        for name in stack.procs
        if any(
            marker in stack.log(name)[stack._offset(name) :]
            for marker in (b"Unrecoverable error", b"Gossip")
        )
    ]
    report = stack.audit()
    record_figures(
        figures(
            "redis_down_10s",
            stack,
            load,
            audit=report,
            seconds_to_finish_after_load=drain_s,
            responses_while_down=dict(sorted(during.items())),
            admitted_after_restart=sum(
                1 for r in load.results if r.at > load.marks["up"] and r.status == 201
            ),
            processes_exited=exited,
        )
    )
    assert not exited and not unrecoverable, (exited, unrecoverable)
    bad = [r for r in load.results if r.status not in (200, 201, 503)]
    assert not bad, f"answers outside the contract: {[(r.status, r.snippet) for r in bad[:5]]}"
    assert all(r.json_body for r in load.results), "every answer is JSON"
    assert sum(during.values()) > 0, "admissions were made while the broker was down"
    assert not (problem := unfinished(acknowledged, states)), problem
    assert stack.replays() == {}
    assert_audit_clean(stack)


# --- PostgreSQL restarted under load -----------------------------------------------------------


@pytest.mark.timeout(400)
def test_postgres_restart_under_load_is_clear_503s_then_recovery(stack, record_figures):
    """Stop PostgreSQL for a few seconds under load. While it is down the API
    answers 503 ``unavailable`` JSON (no HTML, no 500); web and workers
    recover without a restart; every ticket acknowledged before or after
    exists and finishes; no healthy endpoint is quarantined."""
    endpoints = [f"pg.ep-{i}" for i in range(4)]
    for address in endpoints:
        stack.create_endpoint(
            address, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S * 2, interrupt_grace_s=GRACE_S
        )
    load = Load(stack, endpoints, threads=2, pause_s=0.25, timeout_s=20, prefix="pg").start()
    try:
        load.wait_for_count(10)
        load.mark("down")
        stack.pg.stop("fast")
        time.sleep(5)  # the behaviour under test: PostgreSQL down for 5 s under load
        stack.pg.start()
        load.mark("up")
        time.sleep(8)  # the behaviour under test: the load goes on after PostgreSQL is back
    finally:
        load.stop()
    acknowledged = load.acknowledged
    drain = time.monotonic()
    states = stack.wait_terminal(acknowledged, timeout=60)
    drain_s = round(time.monotonic() - drain, 1)
    during = load.statuses(load.marks["down"], load.marks["up"])
    after = [r for r in load.results if r.at > load.marks["up"] + 2]
    quarantined = stack.sql(
        "SELECT address FROM endpoints_endpoint WHERE state <> 'available' AND address LIKE 'pg.%%'"
    )
    cases = stack.sql(
        "SELECT count(*) FROM recovery_recoverycase c JOIN endpoints_endpoint e "
        "ON e.id = c.endpoint_id WHERE e.address LIKE 'pg.%%'"
    )[0][0]
    report = stack.audit()
    record_figures(
        figures(
            "postgres_restart",
            stack,
            load,
            audit=report,
            seconds_to_finish_after_load=drain_s,
            responses_while_down=dict(sorted(during.items())),
            codes_while_down=dict(
                Counter(
                    str(r.code)
                    for r in load.results
                    if load.marks["down"] <= r.at <= load.marks["up"]
                )
            ),
            quarantined=len(quarantined),
            cases=cases,
        )
    )
    assert all(r.json_body for r in load.results), [
        r.snippet for r in load.results if not r.json_body
    ][:3]
    down = [r for r in load.results if r.status not in (200, 201)]
    assert all(r.status == 503 and r.code == "unavailable" for r in down), Counter(
        (r.status, r.code) for r in down
    )
    assert after and all(r.status == 201 for r in after), "web recovered without a restart"
    assert not (problem := unfinished(acknowledged, states)), problem
    assert set(states.values()) == {"succeeded"}, Counter(states.values())
    assert quarantined == [] and cases == 0, "a healthy endpoint was quarantined"
    assert stack.replays() == {}
    assert_audit_clean(stack)


# --- The sweeps down while turns overrun: their own workers enforce the budget ----------------

BUDGET_S = 2
KILL_AFTER_S = 1.5  # the default for a 3 s grace (runners.kill_after_s)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("down", ["control", "beat", "control+beat"] if FULL else ["control+beat"])
def test_sweeps_down_past_a_budget_then_the_workers_stop_the_overrun(stack, record_figures, down):
    """SIGKILL the control worker and/or beat, then run three turns past a
    2 s budget. With no sweep running, each is stopped by the worker that
    runs it: the cooperative one returns at its flag, the isolated one that
    ignores its flag and SIGTERM is SIGKILLed (both fail ``timed_out``
    within budget + grace + kill_after + 2 s of their start, with stop
    evidence), and the inline one that ignores its flag, which nothing can
    prove stopped, is quarantined by its worker with one case. Once the
    sweeps are back they find nothing left to do."""
    prefix = f"over-{down.replace('+', '-')}"
    coop_ep, stubborn_ep, stuck_ep = f"{prefix}.coop", f"{prefix}.stubborn", f"{prefix}.stuck"
    runners = {
        coop_ep: stack.runner(),
        # Ignores its flag and SIGTERM, in a process of its own: the escalation
        # ends it with SIGKILL and the exit status is the evidence.
        stubborn_ep: {"kind": "python", "path": "runtime.demo.stubborn"},
        # Ignores its flag inline, in the pool process: nothing can prove it
        # stopped, so it is quarantined.
        stuck_ep: stack.runner(isolation="inline"),
    }
    for address, runner in runners.items():
        # A 30 s heartbeat timeout would mean a beat every 5 s, longer than
        # the 3 s grace: the worker beats twice per grace instead, so the
        # cooperative runner hears an interrupt the sweep asked for in time.
        stack.create_endpoint(
            address,
            runner=runner,
            turn_budget_s=BUDGET_S,
            interrupt_grace_s=GRACE_S,
            heartbeat_timeout_s=30,
        )
    names = down.split("+")
    for name in names:
        stack.kill(name, signal.SIGKILL)

    def admit(body: dict) -> str:
        resp = stack.http.post("/api/v1/tickets", json=body)
        assert resp.status_code == 201, resp.text
        return resp.json()["id"]

    coop = admit({"endpoint": coop_ep, "input": {"seconds": 60}})
    stubborn = admit({"endpoint": stubborn_ep, "input": {"seconds": 60}})
    # Outlasts the test (the teardown kills it): its pool process stays held.
    stuck = admit({"endpoint": stuck_ep, "input": {"seconds": 60, "ignore_interrupts": True}})
    ids = [coop, stubborn, stuck]

    def turns() -> dict[str, tuple]:
        rows = stack.sql(
            "SELECT ticket_id::text, state, started_at, ended_at, stop_evidence, "
            "interrupt_requested_at FROM runtime_turn WHERE ticket_id = ANY(%s)",
            [ids],
        )
        return {r[0]: r[1:] for r in rows}

    wait_until(lambda: len(turns()) == 3, timeout=60, what="the three turns to start")
    wait_until(
        lambda: stack.states([coop, stubborn]) == {coop: "failed", stubborn: "failed"},
        timeout=40,
        what="the two stoppable turns to fail",
    )
    wait_until(
        lambda: stack.states([stuck])[stuck] == "recovering",
        timeout=40,
        what="the stuck turn to be quarantined by its worker",
    )
    states = stack.states(ids)
    rows = turns()
    assert {t: r[0] for t, r in rows.items()} == {
        coop: "stopped",
        stubborn: "stopped",
        stuck: "uncertain",
    }
    errors = dict(
        stack.sql("SELECT id::text, error->>'code' FROM tickets_ticket WHERE id = ANY(%s)", [ids])
    )
    assert errors[coop] == errors[stubborn] == "timed_out"
    bound = BUDGET_S + GRACE_S + KILL_AFTER_S + 2
    took = {t: (r[2] - r[1]).total_seconds() for t, r in rows.items() if r[2] is not None}
    assert took[coop] <= bound and took[stubborn] <= bound, (took, bound)
    coop_ev, stubborn_ev = rows[coop][3], rows[stubborn][3]
    assert coop_ev["kind"] == "runner_returned" and coop_ev["detail"]["signals_sent"] == []
    assert stubborn_ev["kind"] == "process_exit"
    assert stubborn_ev["detail"]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert stubborn_ev["detail"]["signal"] == "SIGKILL"
    # The interrupts and the quarantine are the workers' own.
    actors = dict(
        stack.sql(
            "SELECT ticket_id::text, string_agg(actor, ',') FROM tickets_ticketevent "
            "WHERE ticket_id = ANY(%s) AND kind IN ('interrupt_requested', 'turn_uncertain') "
            "GROUP BY ticket_id",
            [ids],
        )
    )
    assert actors == {
        coop: "worker:budget",
        stubborn: "worker:budget",
        stuck: "worker:budget,worker:budget",
    }, actors
    quarantined_s = (
        stack.sql(
            "SELECT e.at - t.started_at FROM tickets_ticketevent e JOIN runtime_turn t "
            "ON t.ticket_id = e.ticket_id WHERE e.ticket_id = %s AND e.kind = 'turn_uncertain'",
            [stuck],
        )[0][0]
    ).total_seconds()
    # The deadline, then the inline turn's stop window (its grace), on the
    # heartbeat thread's schedule.
    assert quarantined_s <= BUDGET_S + GRACE_S + 2, quarantined_s

    # The sweeps come back as the safety net: nothing left for them.
    restart = time.monotonic()
    (restarted_at,) = stack.sql("SELECT now()")[0]
    for name in names:
        stack.respawn(name)
    stack.wait_ready(*names)
    back = time.monotonic()
    wait_until(
        lambda: stack.sql(
            "SELECT count(*) FROM health_sweeprun WHERE name = 'budgets' AND last_finished_at > %s",
            [restarted_at],
        )[0][0],
        timeout=30,
        what="a budget sweep after the restart",
    )
    assert stack.states(ids) == states
    assert {t: r[0] for t, r in turns().items()} == {
        coop: "stopped",
        stubborn: "stopped",
        stuck: "uncertain",
    }
    endpoint_states = dict(
        stack.sql(
            "SELECT address, state FROM endpoints_endpoint WHERE address = ANY(%s)",
            [list(runners)],
        )
    )
    assert endpoint_states == {
        coop_ep: "available",
        stubborn_ep: "available",
        stuck_ep: "quarantined",
    }
    open_cases = stack.sql(
        "SELECT count(*) FROM recovery_recoverycase WHERE state = 'open' AND ticket_id = %s",
        [stuck],
    )[0][0]
    assert open_cases == 1
    report = stack.audit()
    record_figures(
        figures(
            f"{down}_down_while_overrunning",
            stack,
            None,
            acknowledged=set(ids),
            audit=report,
            seconds_to_timed_out={
                k: round(took[t], 1) for k, t in (("coop", coop), ("stubborn", stubborn))
            },
            seconds_to_quarantined=round(quarantined_s, 1),
            bound_s=bound,
            seconds_to_restart=round(back - restart, 1),
        )
    )
    assert_audit_clean(stack)


# --- PostgreSQL crashes while turns finish past their budget ----------------------------------


@pytest.mark.timeout(300)
def test_postgres_crash_while_turns_finish_past_budget_keeps_their_results(stack, record_figures):
    """Turns of 2 s on a 2.5 s budget; PostgreSQL crashes (``-m immediate``)
    while they run. Their runners return during the outage and the workers
    retry their finishes; once each has failed a first time, the workers are
    held (SIGSTOP) until the budget sweep, back with the database, has asked
    each turn to stop, so every finish lands after its interrupt (the order
    a long outage produces by chance). Every result that returned before its
    interrupt is recorded ``succeeded``, with its result; nothing runs twice;
    the audit (``discarded_result`` included) is clean."""
    from .runners import returned_file

    # Two turns: they fit beside a turn an earlier fault may have left on a slot.
    endpoints = [f"late.ep-{i}" for i in range(2)]
    for address in endpoints:
        stack.create_endpoint(
            address,
            runner=stack.runner(path="tests.faults.runners.timed"),
            turn_budget_s=2.5,
            interrupt_grace_s=30,
            heartbeat_timeout_s=60,
        )
    ids = []
    for address in endpoints:
        body = {"endpoint": address, "input": {"seconds": 2}}
        resp = stack.http.post("/api/v1/tickets", json=body)
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])

    def turn_ids() -> list[str]:
        rows = stack.sql(
            "SELECT id::text FROM runtime_turn WHERE ticket_id = ANY(%s::uuid[])", [ids]
        )
        return [r[0] for r in rows]

    # Each runner has begun (it counts itself first): it needs the database no more.
    wait_until(
        lambda: all(stack.executions()[i] for i in ids), timeout=60, what="every runner to run"
    )
    turns = turn_ids()
    assert len(turns) == len(ids)
    # The cluster runs with synchronous_commit off: a crash may lose the last
    # commits (the turns' starts). A checkpoint makes them durable first.
    stack.pg.execute("CHECKPOINT", db=stack.db)
    crashed = time.monotonic()
    stack.pg.stop("immediate")
    path = returned_file(str(stack.counter_file))

    def returned() -> dict[str, float]:
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        return {r["ticket"]: r["returned_at"] for r in lines if r["ticket"] in ids}

    workers = [name for name, _ in stack.turns]

    def retrying() -> bool:
        """Each worker holds its outcome: its first finish attempt failed."""
        logs = b"".join(stack.log(name) for name in workers)
        return all(f"finish of turn {t} seq".encode() in logs for t in turns)

    try:
        wait_until(retrying, timeout=30, what="every finish to fail and be retried")
        # Hold the workers, their finish retries with them, until each turn's interrupt is in.
        for name in workers:
            os.killpg(stack.procs[name].pid, signal.SIGSTOP)
        stack.pg.start()
        down_s = time.monotonic() - crashed

        def interrupted() -> int:
            return stack.sql(
                "SELECT count(*) FROM runtime_turn WHERE ticket_id = ANY(%s::uuid[])"
                " AND interrupt_requested_at IS NOT NULL",
                [ids],
            )[0][0]

        wait_until(lambda: interrupted() == len(ids), timeout=90, what="the sweep's interrupts")
    finally:
        for name in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(stack.procs[name].pid, signal.SIGCONT)
    states = stack.wait_terminal(set(ids), timeout=60)
    rows = stack.sql(
        "SELECT t.id::text, t.state, t.error->>'code',"
        " extract(epoch FROM tu.interrupt_requested_at), t.result IS NOT NULL"
        " FROM tickets_ticket t JOIN runtime_turn tu ON tu.id = t.turn_id"
        " WHERE t.id = ANY(%s::uuid[])",
        [ids],
    )
    back = returned()
    before = {r[0]: r for r in rows if back[r[0]] < float(r[3])}
    report = stack.audit()
    record_figures(
        figures(
            "postgres_crash_while_finishing",
            stack,
            None,
            acknowledged=set(ids),
            audit=report,
            seconds_down=round(down_s, 1),
            returned_before_interrupt=len(before),
            outcomes=dict(Counter(f"{r[1]}:{r[2] or ''}" for r in rows)),
        )
    )
    assert not (problem := unfinished(set(ids), states)), problem
    # The construction guarantees it: each runner returned while the database was down.
    assert len(before) == len(ids), rows
    discarded = {i: (r[1], r[2]) for i, r in before.items() if r[1] != "succeeded" or not r[4]}
    assert not discarded, f"results returned before their interrupt, discarded: {discarded}"
    assert stack.replays() == {}
    assert_audit_clean(stack)
