"""The warm turn process of a worker slot (runtime/isolation.py): isolated
turns run in a process forked ahead and kept between turns, replaced after
an interrupt, a kill, a turn that changed the process, N turns, or when it
died between turns. Turns run here, in the test process (the supervisor)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import pytest
from django.db import connection

from core import logs
from endpoints.services import create_endpoint
from runtime import isolation
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn

pytestmark = pytest.mark.django_db

PATH = "tests.endpoints.warm_runners."


def endpoint(address: str, name: str = "where", **kw) -> str:
    create_endpoint(address=address, runner={"kind": "python", "path": PATH + name}, **kw)
    return address


def turn(address: str, **input) -> Ticket:
    ticket = admit_ticket(endpoint=address, input=input).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    return Ticket.objects.get(id=ticket.id)


def ran_in(address: str, **input) -> int:
    ticket = turn(address, **input)
    assert ticket.state == "succeeded", ticket.error
    pid = ticket.result["pid"]
    assert pid != os.getpid()
    return pid


def test_turns_share_the_slots_warm_process_which_answers_through_the_supervisor():
    a, b = endpoint("warm.a"), endpoint("warm.b")
    first = turn(a)
    assert first.state == "succeeded" and first.result["beat"] is True
    # Another endpoint, another runner path: the same process.
    assert ran_in(b) == ran_in(a) == first.result["pid"]
    assert len(isolation._idle) == 1 and isolation._idle[0].pid == first.result["pid"]


def test_the_log_context_and_trace_reach_the_warm_process():
    a = endpoint("warm.trace")
    ran_in(a)  # the process exists before this turn's context is bound
    with logs.bound(trace_id="0af7651916cd43dd8448eb211c80319c"):
        ticket = turn(a)
    assert ticket.result["trace_id"] == "0af7651916cd43dd8448eb211c80319c"


def test_a_turn_that_changes_the_environment_does_not_hand_it_on():
    secret, plain = endpoint("warm.secret", "exports_a_secret"), endpoint("warm.plain")
    before = ran_in(plain)
    leaked = turn(secret)
    assert leaked.result["pid"] == before and leaked.result["leak"] == "a secret of this turn"
    after = turn(plain)
    assert after.result["pid"] != before and after.result["leak"] is None
    assert "CC_WARM_TEST_LEAK" not in os.environ


def test_a_turn_that_leaves_a_thread_running_is_the_last_of_its_process():
    threads, plain = endpoint("warm.thread", "leaves_a_thread"), endpoint("warm.plain2")
    used = ran_in(threads)
    assert ran_in(plain) != used


def test_each_turn_starts_with_the_default_signal_handlers():
    ignoring, plain = endpoint("warm.sigign", "ignores_sigterm"), endpoint("warm.plain3")
    pid = ran_in(ignoring)
    after = turn(plain)
    assert after.result["pid"] == pid and after.result["sigterm_default"] is True


def test_a_process_found_dead_between_turns_is_replaced_with_a_log_line(caplog):
    a = endpoint("warm.dead")
    pid = ran_in(a)
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
        timeout=10,
        message="the warm process to die",
    )
    with caplog.at_level(logging.WARNING, logger="runtime.isolation"):
        replacement = ran_in(a)
    assert replacement != pid
    assert f"warm turn process {pid} exited between turns" in caplog.text
    assert "(SIGKILL)" in caplog.text


def test_a_process_is_replaced_after_the_recycle_count(settings):
    settings.ISOLATION_RECYCLE_TURNS = 2
    a = endpoint("warm.recycle")
    pids = [ran_in(a) for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_replenish_forks_the_next_process_ahead(settings):
    settings.ISOLATION_RECYCLE_TURNS = 1
    a = endpoint("warm.ahead")
    first = ran_in(a)
    assert not isolation._idle
    isolation.replenish()  # the worker does it after each task
    assert len(isolation._idle) == 1
    ahead = isolation._idle[0].pid
    assert ahead != first and ran_in(a) == ahead


def test_a_process_that_exits_in_a_turn_fails_it_and_the_next_turn_gets_another():
    dies, plain = endpoint("warm.exits", "exits"), endpoint("warm.plain4")
    before = ran_in(plain)
    died = turn(dies)
    assert died.state == "failed" and died.error["code"] == "runner_died"
    assert died.error["pid"] == before and died.error["returncode"] == 3
    assert ran_in(plain) != before


def test_an_interrupted_turn_proves_its_stop_by_its_exit_and_is_not_reused():
    """The cooperative stop keeps its evidence (the process's exit status
    after the return), and the next turn runs in a fresh process."""
    nap = endpoint("warm.nap", "naps", turn_budget_s=1, interrupt_grace_s=5)
    plain = endpoint("warm.plain5")
    before = ran_in(plain)
    stopped = turn(nap, seconds=30)
    assert stopped.state == "failed"
    ev = Turn.objects.get(ticket_id=stopped.id).stop_evidence
    assert ev["kind"] == "runner_returned"
    assert ev["detail"]["pid"] == before and ev["detail"]["returncode"] == 0
    assert ev["detail"]["signals_sent"] == []
    assert ran_in(plain) != before


@pytest.mark.django_db(transaction=True)
def test_a_thread_other_than_the_main_one_keeps_no_process():
    """PR_SET_PDEATHSIG follows the thread that forked: a process forked by
    another thread serves that one turn."""
    a = endpoint("warm.thread-main")
    box = {}

    def run():
        try:
            box["pid"] = ran_in(a)
        finally:
            connection.close()

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert box["pid"] and not isolation._idle


def test_the_history_is_read_by_the_supervisor_only_when_the_turn_asks(monkeypatch):
    from runtime.turns import execute

    calls = []

    def history(*args, **kw):
        calls.append(args)
        raise ValueError("the ledger is unreadable")

    monkeypatch.setattr(execute, "recent_history", history)
    create_endpoint(
        address="warm.no-history", runner={"kind": "python", "path": "runtime.demo.echo"}
    )
    assert turn("warm.no-history").state == "succeeded" and not calls
    failed = turn(endpoint("warm.history", "reads_history"))
    assert len(calls) == 1
    # Never an empty history in its place: the runner hears of the failure.
    assert failed.state == "failed" and failed.error["code"] == "runner_raised"
    assert "history could not be read" in failed.error["detail"]
