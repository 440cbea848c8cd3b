"""Process isolation of python turns (docs/explanation/design.md, "Turn isolation"): a
callable that ignores its interrupt is stopped by the escalation (SIGTERM,
then SIGKILL) and the ``waitpid`` status of its own process is the evidence;
the worker slot is free again. Real workers, real beat (0.5 s sweeps)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from core.errors import Invalid
from endpoints.models import Endpoint
from endpoints.services import validate_runner
from recovery.models import RecoveryCase
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn

pytestmark = [pytest.mark.django_db(transaction=True)]

# Budget 1 s, grace 1 s, kill_after 0.5 s: the escalation ends within ~3 s of
# the deadline; 2 sweep intervals are 1 s.
STUBBORN = dict(turn_budget_s=1, interrupt_grace_s=1)
RUNNER = {"kind": "python", "path": "runtime.demo.stubborn", "kill_after_s": 0.5}
# The same, announcing (a file) once its callable runs and ignores SIGTERM.
READY_RUNNER = {**RUNNER, "path": "tests.endpoints.ready_runners.stubborn"}
READY_SLEEP = "tests.endpoints.ready_runners.sleep"


def state_of(ticket_id) -> str:
    return Ticket.objects.get(id=ticket_id).state


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _workers(celery_procs, turns_concurrency: int) -> None:
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=turns_concurrency)


@pytest.mark.integration
def test_a_stubborn_callable_is_stopped_by_the_escalation_with_proof(celery_procs, make_endpoint):
    _workers(celery_procs, 1)
    make_endpoint("iso.stubborn", runner=RUNNER, **STUBBORN)
    make_endpoint("iso.echo")
    stubborn = admit_ticket(endpoint="iso.stubborn", input={"seconds": 120}).ticket
    wait_for(lambda: state_of(stubborn.id) == "running", timeout=30, message="the turn to start")
    turn = Turn.objects.get(ticket=stubborn)
    # The one slot is busy: the next ticket (another endpoint) waits for it.
    echo = admit_ticket(endpoint="iso.echo", input={"n": 1}).ticket
    # budget 1 + grace 1 + kill_after 0.5 + 2 sweeps 1 + generous slack for a loaded machine
    wait_for(
        lambda: state_of(stubborn.id) == "failed", timeout=25, message="the escalation to stop it"
    )
    turn.refresh_from_db()
    assert turn.state == "stopped" and turn.interrupt_reason == "deadline"
    ev = turn.stop_evidence
    assert ev["kind"] == "process_exit" and ev["seq"] == turn.seq
    assert ev["detail"]["signal"] == "SIGKILL"
    assert ev["detail"]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert ev["detail"]["isolation"] == "process"
    assert not _pid_alive(ev["detail"]["pid"])
    error = Ticket.objects.get(id=stubborn.id).error
    assert error["code"] == "timed_out" and error["signals"] == ["SIGTERM", "SIGKILL"]
    assert "SIGKILL" in error["detail"]
    wait_for(lambda: state_of(echo.id) == "succeeded", timeout=15, message="the freed slot")
    assert Endpoint.objects.get(address="iso.stubborn").state == "available"
    assert not RecoveryCase.objects.exists()


@pytest.mark.integration
def test_two_stubborn_turns_do_not_eat_a_two_slot_pool(celery_procs, make_endpoint):
    _workers(celery_procs, 2)
    make_endpoint("iso.a", runner=RUNNER, **STUBBORN)
    make_endpoint("iso.b", runner=RUNNER, **STUBBORN)
    make_endpoint("iso.c")
    a = admit_ticket(endpoint="iso.a", input={"seconds": 120}).ticket
    b = admit_ticket(endpoint="iso.b", input={"seconds": 120}).ticket
    wait_for(
        lambda: state_of(a.id) == state_of(b.id) == "running",
        timeout=30,
        message="both stubborn turns to start",
    )
    c = admit_ticket(endpoint="iso.c", input={"n": 3}).ticket
    wait_for(lambda: state_of(c.id) == "succeeded", timeout=25, message="the third endpoint")
    # c ran as soon as one slot was free; the other stubborn turn may be a
    # heartbeat interval behind in its own escalation.
    wait_for(
        lambda: state_of(a.id) == state_of(b.id) == "failed",
        timeout=10,
        message="both stubborn turns stopped and failed",
    )
    assert not RecoveryCase.objects.exists()


@pytest.mark.integration
def test_an_honouring_isolated_turn_stops_cooperatively(worker, make_endpoint):
    make_endpoint("iso.nap", path="runtime.demo.sleep", turn_budget_s=1, interrupt_grace_s=5)
    t = admit_ticket(endpoint="iso.nap", input={"seconds": 60}).ticket
    wait_for(lambda: state_of(t.id) == "failed", timeout=20, message="the turn to stop")
    turn = Turn.objects.get(ticket=t)
    assert turn.stop_evidence["kind"] == "runner_returned"
    assert turn.stop_evidence["detail"]["isolation"] == "process"
    assert turn.stop_evidence["detail"]["signals_sent"] == []
    assert turn.stop_evidence["detail"]["returncode"] == 0


@pytest.mark.integration
def test_an_isolated_turn_reaches_the_database_through_its_supervisor(worker, make_endpoint):
    """children_of and heartbeat are answered by the supervising worker."""
    make_endpoint("iso.echo2")
    make_endpoint("iso.research", path="runtime.demo.research")
    root = admit_ticket(
        endpoint="iso.research", input={"children": 2, "child_endpoint": "iso.echo2"}
    ).ticket
    wait_for(lambda: state_of(root.id) == "succeeded", timeout=40, message="the research")
    result = Ticket.objects.get(id=root.id).result
    assert [c["state"] for c in result["children"]] == ["succeeded", "succeeded"]


def test_runner_isolation_and_kill_after_are_validated(db):
    ok = {"kind": "python", "path": "runtime.demo.echo"}
    assert validate_runner({**ok, "isolation": "inline"})["isolation"] == "inline"
    assert validate_runner({**ok, "isolation": "process", "kill_after_s": 2})
    for bad in (
        {**ok, "isolation": "thread"},
        {**ok, "kill_after_s": 0},
        {**ok, "kill_after_s": 61},
        {**ok, "kill_after_s": True},
        {**ok, "kill_after_s": "5"},
    ):
        with pytest.raises(Invalid):
            validate_runner(bad)


def test_the_stop_window_covers_the_escalation_only_for_isolated_turns():
    from runtime import runners

    iso = {"kind": "python", "path": "x.y", "kill_after_s": 2}
    inline = {**iso, "isolation": "inline"}
    assert runners.stop_window_s(inline, 30, 5) == 5
    assert runners.stop_window_s({"kind": "http", "url": "http://x"}, 30, 5) == 5
    assert runners.stop_window_s(iso, 30, 5) > 5 + 2


@pytest.mark.integration
@pytest.mark.parametrize(
    ("runner", "evidence", "signals", "group"),
    [
        ({"kind": "python", "path": READY_SLEEP}, "runner_returned", [], True),
        (READY_RUNNER, "process_exit", ["SIGTERM", "SIGKILL"], True),
        # Only the main process hears it: it passes the stop to the pool
        # process that runs the turn.
        (READY_RUNNER, "process_exit", ["SIGTERM", "SIGKILL"], False),
    ],
    ids=["honouring", "stubborn-isolated", "stubborn-isolated-main-only"],
)
def test_sigterm_stops_the_running_turn_with_evidence_and_exits_in_time(
    celery_procs, make_endpoint, tmp_path, runner, evidence, signals, group
):
    _workers(celery_procs, 1)
    grace = 1
    make_endpoint("iso.term", runner=runner, turn_budget_s=300, interrupt_grace_s=grace)
    ready = tmp_path / "ready"
    t = admit_ticket(endpoint="iso.term", input={"seconds": 120, "ready_file": str(ready)}).ticket
    wait_for(ready.exists, timeout=30, message="the isolated child to run its callable")
    assert state_of(t.id) == "running"
    proc = celery_procs.procs.pop("turns")
    started = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
    try:
        # In time: the grace, kill_after_s and "a few seconds" of Celery's
        # warm shutdown (docs/explanation/design.md), far short of the 120 s turn. The
        # margin is 10 s, as a heavily loaded machine starts and stops Python slowly.
        proc.wait(timeout=grace + 0.5 + 10)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    took = time.monotonic() - started
    turn = Turn.objects.get(ticket=t)
    assert turn.state == "stopped", (turn.state, took)
    assert turn.interrupt_reason == "shutdown"
    assert turn.stop_evidence["kind"] == evidence
    assert turn.stop_evidence["detail"].get("signals_sent", []) == signals
    ticket = Ticket.objects.get(id=t.id)
    assert ticket.state == "failed" and ticket.error["code"] == "interrupted"
    assert not RecoveryCase.objects.exists()


def test_an_outcome_sent_just_before_the_child_exits_is_not_lost():
    """The child sends its outcome and exits; if the supervisor's poll looked
    just before the message arrived and its reap just after the exit, the
    outcome is still in the pipe and must be read, not reported as a crash
    (seen under load: a research callback failed `runner_died`)."""
    import multiprocessing
    import threading
    import types

    from runtime import isolation
    from runtime.runners import Outcome

    mp = multiprocessing.get_context("fork")
    parent_conn, child_conn = mp.Pipe(duplex=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        child_conn.send(("outcome", Outcome.success({"ok": 1})))
        os._exit(0)
    child_conn.close()
    from pathlib import Path

    wait_for(  # the child has sent and exited (a zombie until reaped)
        lambda: Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z",
        timeout=10,
        message="the child to exit",
    )

    class MissesTheFirstPoll:
        """The pipe, but its first poll answers as if the message were not there yet."""

        def __init__(self, conn):
            self.conn, self.polls = conn, 0

        def poll(self, timeout=0):
            self.polls += 1
            return False if self.polls == 1 else self.conn.poll(timeout)

        def __getattr__(self, name):
            return getattr(self.conn, name)

    turn = isolation.IsolatedTurn(
        pid=pid,
        turn_id="t",
        conn=MissesTheFirstPoll(parent_conn),
        child_interrupt=threading.Event(),
        grace_s=1,
        kill_after_s=1,
    )
    ctx = types.SimpleNamespace(turn_id="t", _interrupt=threading.Event())
    outcome = isolation._supervise(ctx, turn)
    assert outcome.kind == "success" and outcome.result == {"ok": 1}
