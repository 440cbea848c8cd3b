"""Time budgets: interrupt the exact turn; quarantine when it cannot be
proven stopped. Real worker, real beat (0.5 s sweeps), real PostgreSQL."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from endpoints.models import Endpoint
from recovery.models import CaseEvidence, RecoveryCase
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent, Turn

pytestmark = [pytest.mark.django_db(transaction=True)]


# The sweeps that would dispatch, replay or stop a turn (core/sweeps.py).
SWEEPS = ("runtime.sweep_budgets", "runtime.sweep_lost_dispatches")


def state_of(ticket_id) -> str:
    return Ticket.objects.get(id=ticket_id).state


@pytest.mark.integration
def test_sleep_over_budget_stops_cooperatively_and_the_next_ticket_runs(worker, make_endpoint):
    make_endpoint("nap", path="runtime.demo.sleep", turn_budget_s=1, interrupt_grace_s=5)
    slow = admit_ticket(endpoint="nap", input={"seconds": 60}).ticket
    quick = admit_ticket(endpoint="nap", input={"seconds": 0}).ticket
    wait_for(lambda: state_of(slow.id) == "failed", timeout=20, message="the slow turn to stop")
    t = Ticket.objects.get(id=slow.id)
    assert t.error["code"] == "timed_out"
    turn = Turn.objects.get(ticket=slow)
    assert turn.state == "stopped" and turn.interrupt_reason == "deadline"
    assert turn.stop_evidence["kind"] == "runner_returned"
    assert turn.stop_evidence["seq"] == turn.seq
    wait_for(lambda: state_of(quick.id) == "succeeded", timeout=20, message="the next ticket")
    assert Endpoint.objects.get(address="nap").state == "available"
    assert not RecoveryCase.objects.exists()


@pytest.mark.integration
def test_stuck_over_budget_is_quarantined_and_fails_closed(celery_procs, make_endpoint, api):
    worker = celery_procs
    worker.env["LOG_LEVEL"] = "DEBUG"  # the sweeps' runs are DEBUG lines (core/logs.py)
    worker.worker_and_beat()
    make_endpoint("glue", path="runtime.demo.stuck", turn_budget_s=1, interrupt_grace_s=1)
    stuck = api.post(
        "/tickets", {"endpoint": "glue", "input": {"seconds": 6}, "dedupe_key": "s1"}
    ).json()
    queued = api.post("/tickets", {"endpoint": "glue", "input": {"seconds": 0}}).json()
    case = wait_for(
        lambda: RecoveryCase.objects.filter(endpoint__address="glue").first(),
        timeout=20,
        message="a recovery case",
    )
    assert case.state == "open" and str(case.ticket_id) == stuck["id"]
    assert "no stop evidence" in case.reason
    assert state_of(stuck["id"]) == "recovering"
    turn = Turn.objects.get(ticket_id=stuck["id"])
    assert turn.state == "uncertain"
    # The uncertain turn keeps the lock: nothing else may touch the context.
    assert EndpointLock.objects.get(endpoint__address="glue").holder_id == turn.id
    endpoint = api.get("/endpoints/glue").json()
    assert endpoint["state"] == "quarantined" and endpoint["open_case"] == str(case.id)

    refused = api.post("/tickets", {"endpoint": "glue", "input": {"seconds": 0}})
    assert refused.status_code == 423
    assert refused.json()["error"] == "endpoint_quarantined"
    assert refused.json()["case"] == str(case.id)
    # A duplicate of an existing ticket still finds that ticket.
    dup = api.post("/tickets", {"endpoint": "glue", "input": {"seconds": 6}, "dedupe_key": "s1"})
    assert dup.status_code == 200 and dup.json()["id"] == stuck["id"]

    # The stuck callable returns after ~6 s: a late result, stored as evidence
    # on the case and applied to nothing.
    wait_for(
        lambda: CaseEvidence.objects.filter(case=case).exists(),
        timeout=20,
        message="the late result as evidence",
    )
    ev = CaseEvidence.objects.get(case=case)
    assert ev.seq == turn.seq and ev.kind.startswith("late_")
    # Quarantine holds over many sweeps, whatever arrives.
    swept = worker.runs("turns", *SWEEPS)

    def holds_over_sweeps():
        assert Endpoint.objects.get(address="glue").state == "quarantined"
        assert state_of(queued["id"]) == "queued"  # never dispatched
        assert state_of(stuck["id"]) == "recovering"
        return worker.runs("turns", *SWEEPS) >= swept + 6

    wait_for(holds_over_sweeps, timeout=30, message="six sweeps with the quarantine holding")
    assert Turn.objects.get(id=turn.id).state == "uncertain"
    assert RecoveryCase.objects.filter(endpoint__address="glue").count() == 1


@pytest.mark.integration
def test_worker_killed_mid_turn_ends_in_quarantine_without_replay(celery_procs, make_endpoint):
    # Sweeps and beat live apart from the worker that dies; their runs are
    # DEBUG lines (core/logs.py), which the test counts.
    celery_procs.env["LOG_LEVEL"] = "DEBUG"
    celery_procs.control_and_beat()
    celery_procs.env.pop("LOG_LEVEL")
    celery_procs.worker("turns", queues="turns", concurrency=1)
    make_endpoint(
        "fragile",
        path="runtime.demo.sleep",
        heartbeat_timeout_s=1.5,
        interrupt_grace_s=1,
        turn_budget_s=300,
    )
    ticket = admit_ticket(endpoint="fragile", input={"seconds": 120}).ticket
    wait_for(lambda: state_of(ticket.id) == "running", message="the turn to start")
    celery_procs.kill("turns", sig=signal.SIGKILL)
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=ticket).first(),
        timeout=20,
        message="quarantine after the heartbeat went stale",
    )
    turn = Turn.objects.get(ticket=ticket)
    assert turn.state == "uncertain" and turn.interrupt_reason == "heartbeat"
    assert "heartbeat" in case.reason
    # A new worker comes up: no automatic replay of the uncertain ticket.
    celery_procs.worker("turns2", queues="turns", concurrency=1)
    swept = celery_procs.runs("control", *SWEEPS)

    def holds_over_sweeps():
        assert state_of(ticket.id) == "recovering"
        return celery_procs.runs("control", *SWEEPS) >= swept + 6

    wait_for(holds_over_sweeps, timeout=30, message="six sweeps with the ticket held")
    running = TicketEvent.objects.filter(ticket=ticket, to_state="running")
    assert running.count() == 1
    assert Turn.objects.filter(ticket=ticket).count() == 1


SIGTERM_IGNORER = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.read()
    time.sleep(120)  # the behaviour under test: a command's own work, deaf to SIGTERM
    """
)


@pytest.mark.integration
def test_command_that_ignores_sigterm_is_killed_and_its_exit_is_evidence(
    worker, make_endpoint, tmp_path
):
    script = tmp_path / "ignore.py"
    script.write_text(SIGTERM_IGNORER)
    make_endpoint(
        "deaf",
        runner={"kind": "command", "argv": [sys.executable, str(script)], "kill_after_s": 1},
        turn_budget_s=1,
        interrupt_grace_s=6,
    )
    ticket = admit_ticket(endpoint="deaf", input={}).ticket
    wait_for(lambda: state_of(ticket.id) == "failed", timeout=25, message="the kill")
    turn = Turn.objects.get(ticket=ticket)
    assert turn.state == "stopped"
    evidence = turn.stop_evidence
    assert evidence["kind"] == "process_exit"
    assert evidence["detail"]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert evidence["detail"]["signal"] == "SIGKILL"
    assert Endpoint.objects.get(address="deaf").state == "available"


# --- Sweeps against real PostgreSQL, in-process -----------------------------------------------


def _running_turn(make_endpoint, **kw):
    endpoint = make_endpoint(path="runtime.demo.sleep", **kw)
    ticket = admit_ticket(endpoint=endpoint.address, input={}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    return started.turn


def _past_grace(turn):
    """Poll until the turn's interrupt grace has run out."""

    def elapsed():
        t = Turn.objects.select_related("endpoint").get(id=turn.id)
        grace = timedelta(seconds=t.endpoint.interrupt_grace_s)
        return timezone.now() > t.interrupt_requested_at + grace

    wait_for(elapsed, timeout=5, message="the grace period to run out")


def _concurrently(fn, n=2):
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        try:
            barrier.wait()
            results[i] = fn()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_concurrent_sweeps_make_one_interrupt_and_one_case(make_endpoint):
    turn = _running_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
    wait_for(
        lambda: timezone.now() > Turn.objects.get(id=turn.id).deadline_at,
        message="the deadline to pass",
    )
    for _ in range(3):
        _concurrently(runtime.sweep_budgets)
    interrupts = TicketEvent.objects.filter(ticket_id=turn.ticket_id, kind="interrupt_requested")
    assert interrupts.count() == 1
    wait_for(
        lambda: (
            _concurrently(runtime.sweep_budgets) and RecoveryCase.objects.filter(turn=turn).exists()
        ),
        timeout=5,
        message="a case",
    )
    for _ in range(3):
        _concurrently(runtime.sweep_budgets)
    assert RecoveryCase.objects.filter(endpoint_id=turn.endpoint_id).count() == 1
    assert Turn.objects.get(id=turn.id).state == "uncertain"


def test_racing_transitions_without_the_advisory_lock_still_act_once(make_endpoint):
    turn = _running_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
    results = _concurrently(
        lambda: runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="t"), n=4
    )
    assert sorted(results) == [False, False, False, True]
    _past_grace(turn)
    cases = _concurrently(lambda: runtime.quarantine_turn(turn_id=turn.id), n=4)
    assert len([c for c in cases if c is not None]) == 1
    assert RecoveryCase.objects.filter(turn=turn).count() == 1


def test_nothing_but_an_owner_decision_clears_quarantine(make_endpoint):
    turn = _running_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
    runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="t")
    _past_grace(turn)
    case = runtime.quarantine_turn(turn_id=turn.id)
    assert case is not None
    # A later heartbeat, a late stop receipt, more sweeps: nothing clears it.
    assert runtime.heartbeat(turn_id=turn.id, seq=turn.seq).current is False
    late = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=runtime.Outcome.stopped("agent_stop_receipt"),
        source="api",
    )
    assert late.accepted is False
    runtime.sweep_budgets()
    runtime.sweep_lost_dispatches()
    assert Endpoint.objects.get(id=turn.endpoint_id).state == "quarantined"
    assert Turn.objects.get(id=turn.id).state == "uncertain"
    assert CaseEvidence.objects.filter(case_id=case, kind="late_stopped").count() == 1


def test_a_quarantined_endpoint_admits_and_starts_nothing(make_endpoint):
    turn = _running_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
    address = turn.endpoint.address
    waiting = admit_ticket(endpoint=address, input={"before": True}).ticket
    runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="t")
    _past_grace(turn)
    runtime.quarantine_turn(turn_id=turn.id)
    from core.errors import EndpointQuarantined

    with pytest.raises(EndpointQuarantined):
        admit_ticket(endpoint=address, input={"after": True})
    assert Ticket.objects.filter(endpoint__address=address).count() == 2
    # The ticket queued before quarantine is never started.
    assert runtime.start_turn(ticket_id=waiting.id) is None
    assert state_of(waiting.id) == "queued"


# --- The worker's own enforcement and the sweep, racing -------------------------------------


def _race(*fns):
    """Run ``fns`` at once (a barrier), each on a thread of its own with its
    own database connection; their results in order."""
    barrier = threading.Barrier(len(fns))
    results = [None] * len(fns)
    errors = []

    def run(i):
        try:
            barrier.wait()
            results[i] = fns[i]()
        except Exception as exc:  # reported below: a thread's error must fail the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _watched_turn(make_endpoint, **kw):
    """A running inline turn past its deadline and the worker's watch of it,
    as the worker process that started it holds it."""
    turn = _running_turn(make_endpoint, isolation="inline", **kw)
    wait_for(
        lambda: timezone.now() > Turn.objects.get(id=turn.id).deadline_at,
        message="the deadline to pass",
    )
    turn = Turn.objects.select_related("endpoint").get(id=turn.id)
    watch = runtime.BudgetWatch(turn=turn, endpoint=turn.endpoint, interrupt=threading.Event())
    return turn, watch


def test_the_workers_watch_and_the_sweep_make_one_interrupt_and_one_case(make_endpoint):
    """The worker's own enforcement and the budget sweep act on the same
    turn at the same moment, at the deadline and again when the grace has
    run out: one interrupt, one quarantine, one case, whoever wins. (A
    grace of 1 s: a shorter one could run out between the two, and the
    sweep would then quarantine in the first race, as it should.)"""
    for _ in range(3):
        turn, watch = _watched_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=1)
        _race(runtime.sweep_budgets, lambda w=watch: w.step(w.deadline))
        interrupts = TicketEvent.objects.filter(
            ticket_id=turn.ticket_id, kind="interrupt_requested"
        )
        assert interrupts.count() == 1
        assert interrupts.get().detail["seq"] == turn.seq
        assert Turn.objects.get(id=turn.id).state == "interrupting"
        assert watch.interrupt.is_set(), "the runner's flag is raised without the sweep's help"
        _past_grace(turn)
        _race(runtime.sweep_budgets, lambda w=watch: w.step(w.flag_at + w.stop_window))
        assert RecoveryCase.objects.filter(turn=turn).count() == 1
        assert Turn.objects.get(id=turn.id).state == "uncertain"
        assert state_of(turn.ticket_id) == "recovering"
        assert Endpoint.objects.get(id=turn.endpoint_id).state == "quarantined"
        assert (
            TicketEvent.objects.filter(
                ticket_id=turn.ticket_id, kind="endpoint_quarantined"
            ).count()
            == 1
        )


def test_a_stop_racing_the_workers_quarantine_ends_the_turn_one_way(make_endpoint):
    """The runner's stop evidence arrives as the watch gives up on it: either
    the turn stopped (ticket timed out, no case) or it is uncertain (case,
    the stop kept as evidence), never a mixture."""
    seen = set()
    for _ in range(6):
        turn, watch = _watched_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
        watch.step(watch.deadline)
        _past_grace(turn)
        stopped = runtime.Outcome.stopped("runner_returned", {"after_interrupt": True})
        _race(
            lambda w=watch: w.step(w.flag_at + w.stop_window),
            lambda t=turn, o=stopped: runtime.finish_turn(
                turn_id=t.id, seq=t.seq, outcome=o, source="worker"
            ),
        )
        t = Turn.objects.get(id=turn.id)
        ticket = Ticket.objects.get(id=turn.ticket_id)
        cases = RecoveryCase.objects.filter(turn=turn).count()
        if t.state == "stopped":
            assert ticket.state == "failed" and ticket.error["code"] == "timed_out"
            assert cases == 0
            assert Endpoint.objects.get(id=turn.endpoint_id).state == "available"
        else:
            assert t.state == "uncertain" and ticket.state == "recovering" and cases == 1
            assert CaseEvidence.objects.filter(case__turn=turn, kind="late_stopped").count() == 1
        seen.add(t.state)
    assert seen <= {"stopped", "uncertain"}


def test_the_watch_leaves_a_turn_whose_runner_returned_and_asks_for_its_exact_seq(make_endpoint):
    turn, watch = _watched_turn(make_endpoint, turn_budget_s=0.05, interrupt_grace_s=0.05)
    watch.runner_returned()
    watch.step(watch.deadline + 60)
    assert Turn.objects.get(id=turn.id).state == "running"
    assert not watch.interrupt.is_set()
    # The interrupt names the exact turn and its seq: another seq asks nothing.
    assert not runtime.request_interrupt(
        turn_id=turn.id, seq=turn.seq + 1, reason="deadline", actor="t"
    )
    assert runtime.request_interrupt(turn_id=turn.id, seq=turn.seq, reason="deadline", actor="t")


# --- A late outcome: the result the exact turn produced is never discarded ---------------------


def _interrupted_turn(make_endpoint, **kw):
    turn = _running_turn(make_endpoint, **kw)
    assert runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="sweeper")
    return Turn.objects.select_related("endpoint").get(id=turn.id)


def test_a_success_that_returned_before_its_interrupt_is_the_turns_result(make_endpoint):
    """The finish lands after the sweep asked for an interrupt (the database
    was away), but the runner had returned before: the ticket succeeds with
    its result, and the terminal event keeps the timing."""
    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=5)
    before_interrupt = (turn.interrupt_requested_at - turn.started_at).total_seconds() - 0.001
    done = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=runtime.Outcome.success({"answer": 42}),
        source="worker",
        ran_s=before_interrupt,
    )
    assert done.accepted and done.ticket_state == "succeeded"
    ticket = Ticket.objects.get(id=turn.ticket_id)
    assert ticket.state == "succeeded" and ticket.result == {"answer": 42}
    assert Turn.objects.get(id=turn.id).state == "completed"
    event = TicketEvent.objects.get(ticket_id=ticket.id, kind="turn_completed")
    assert event.detail["late"]["ran_s"] == round(before_interrupt, 3)
    assert event.detail["late"]["reason"] == "deadline"
    assert EndpointLock.objects.get(endpoint_id=turn.endpoint_id).holder_id is None


def test_a_success_that_returned_after_its_interrupt_is_stopped_with_its_timing(make_endpoint):
    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=5)
    after_interrupt = (turn.interrupt_requested_at - turn.started_at).total_seconds() + 0.5
    done = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=runtime.Outcome.success({"answer": 42}),
        source="worker",
        ran_s=after_interrupt,
    )
    assert done.accepted and done.ticket_state == "failed"
    ticket = Ticket.objects.get(id=turn.ticket_id)
    assert ticket.error["code"] == "timed_out" and ticket.result is None
    event = TicketEvent.objects.get(ticket_id=ticket.id, kind="turn_stopped")
    assert event.detail["outcome"] == "success"
    assert event.detail["ran_s"] == round(after_interrupt, 3)
    returned_by = timezone.datetime.fromisoformat(event.detail["returned_by"])
    assert returned_by > turn.interrupt_requested_at


def test_a_late_outcome_without_a_run_time_is_stopped(make_endpoint):
    """An agent's answer through the API carries no run time: it returned
    when it arrived, after the interrupt."""
    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=5)
    done = runtime.finish_turn(
        turn_id=turn.id, seq=turn.seq, outcome=runtime.Outcome.success({}), source="api"
    )
    assert done.ticket_state == "failed"
    assert Ticket.objects.get(id=turn.ticket_id).error["code"] == "timed_out"


def test_a_late_outcome_past_budget_and_grace_is_stopped(make_endpoint):
    """It returned before a late interrupt (the sweep was away), but past the
    turn's budget + grace: the turn is stopped as any overrun."""
    turn = _running_turn(make_endpoint, turn_budget_s=0.01, interrupt_grace_s=0.01)
    # The interrupt comes 0.1 s after the start or later, past budget + grace (0.02 s).
    wait_for(
        lambda: timezone.now() > turn.started_at + timedelta(seconds=0.1),
        timeout=5,
        message="0.1 s to pass",
    )
    assert runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="sweeper")
    done = runtime.finish_turn(
        turn_id=turn.id,
        seq=turn.seq,
        outcome=runtime.Outcome.success({}),
        source="worker",
        ran_s=0.05,
    )
    assert done.ticket_state == "failed"
    assert Ticket.objects.get(id=turn.ticket_id).error["code"] == "timed_out"


@pytest.mark.parametrize("kind", ["failure", "stopped"])
def test_a_late_failure_is_a_result_and_a_late_stop_is_a_stop(make_endpoint, kind):
    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=5)
    outcome = (
        runtime.Outcome.failure({"code": "boom", "detail": "it failed"})
        if kind == "failure"
        else runtime.Outcome.stopped("runner_returned")
    )
    done = runtime.finish_turn(
        turn_id=turn.id, seq=turn.seq, outcome=outcome, source="worker", ran_s=0.0
    )
    ticket = Ticket.objects.get(id=turn.ticket_id)
    assert done.ticket_state == ticket.state == "failed"
    assert ticket.error["code"] == ("boom" if kind == "failure" else "timed_out")
    assert Turn.objects.get(id=turn.id).state == ("failed" if kind == "failure" else "stopped")


# --- A held outcome: a live worker's finish on its way is not taken for a lost turn -------------


def test_the_sweep_does_not_quarantine_a_turn_whose_worker_holds_its_outcome(make_endpoint):
    """The worker's finish waits for the database (behind a pooler, past the
    sweep's direct connection): it announces the outcome it holds through
    Redis (runtime/turns/held.py). Past the grace the sweep leaves the turn
    interrupting while the announcement lives; the finish then lands as the
    turn's result; the announcement is taken back."""
    from runtime.turns import held as held_module
    from runtime.turns.held import held, holding

    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=0.05)
    # A finish that lands in time announces nothing and leaves nothing to write.
    with held(turn.id, turn.seq, "success", 0.1):
        pass
    assert turn.id not in held_module._holder()._entries
    before_interrupt = (turn.interrupt_requested_at - turn.started_at).total_seconds() - 0.001
    with held(turn.id, turn.seq, "success", before_interrupt):
        wait_for(lambda: holding(turn.id, turn.seq), timeout=10, message="the announcement")
        report = wait_for(
            lambda: (r := runtime.sweep_budgets()).held and r,
            timeout=10,
            message="the sweep to hold off past the stop window",
        )
        assert report.held == [turn.id] and not report.quarantined
        assert Turn.objects.get(id=turn.id).state == "interrupting"
        assert not RecoveryCase.objects.filter(turn=turn).exists()
        done = runtime.finish_turn(
            turn_id=turn.id,
            seq=turn.seq,
            outcome=runtime.Outcome.success({"answer": 42}),
            source="worker",
            ran_s=before_interrupt,
        )
    assert done.accepted and done.ticket_state == "succeeded"
    assert Ticket.objects.get(id=turn.ticket_id).result == {"answer": 42}
    wait_for(lambda: holding(turn.id, turn.seq) is None, timeout=10, message="it taken back")
    assert Endpoint.objects.get(id=turn.endpoint_id).state == "available"


def test_an_outcome_held_for_another_seq_or_by_nobody_does_not_stop_the_quarantine(
    make_endpoint,
):
    import json

    from runtime.turns import held

    turn = _interrupted_turn(make_endpoint, turn_budget_s=5, interrupt_grace_s=0.05)
    held._client().set(held.key(turn.id), json.dumps({"seq": turn.seq + 1}), ex=30)
    try:
        wait_for(
            lambda: runtime.sweep_budgets().quarantined,
            timeout=10,
            message="the quarantine of a turn nobody holds",
        )
    finally:
        held._client().delete(held.key(turn.id))
    assert Turn.objects.get(id=turn.id).state == "uncertain"
