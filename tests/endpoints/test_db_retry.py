"""A worker that knows a turn's outcome records it through a database blip,
exactly once; start and heartbeat survive one too (issue 9, finding 2).

These run in-process against the real test database. A lost COMMIT reply
cannot be timed with a real restart, so it is injected: the real service
commits, then its caller sees the OperationalError a dropped connection
gives. tests/test_db_outage.py does the real restart with a real worker."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import IntegrityError, OperationalError

from core.errors import StaleTurn
from core.transient import is_transient, retry_transient
from runtime import runners
from runtime import turns as runtime
from runtime.runners import Outcome
from runtime.turns import execute, heartbeats
from tickets.admission import admit_ticket
from tickets.models import ContextEntry, EndpointLock, LedgerEvent, Ticket, TicketEvent, Turn

from ..conftest import purge_broker, queued_tasks, wait_for
from .chains import started_in_a_finish

LOST = "server closed the connection unexpectedly"


def lose_reply_once(real):
    """``real`` runs (and commits); the first call's caller then gets the
    error a connection dropped before the reply gives."""
    calls = []

    def flaky(**kwargs):
        calls.append(kwargs)
        value = real(**kwargs)
        if len(calls) == 1:
            raise OperationalError(LOST)
        return value

    flaky.calls = calls
    return flaky


def fail_first(n, real, exc=OperationalError):
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= n:
            raise exc("terminating connection due to administrator command")
        return real(*args, **kwargs)

    flaky.calls = calls
    return flaky


# --- retry_transient --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_transient_errors_are_retried_with_a_warning_naming_what(caplog):
    flaky = fail_first(2, lambda: "done")
    with caplog.at_level(logging.WARNING, logger="core.transient"):
        value = retry_transient(flaky, what="finish of turn T seq 7", max_s=10, base_s=0.01)
    assert value == "done"
    assert len(flaky.calls) == 3
    retries = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == 2 and all("finish of turn T seq 7" in r.getMessage() for r in retries)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "exc", [IntegrityError, StaleTurn, ValueError], ids=["integrity", "domain", "bug"]
)
def test_other_errors_are_not_retried(exc):
    flaky = fail_first(5, lambda: "done", exc=exc)
    with pytest.raises(exc):
        retry_transient(flaky, what="x", max_s=10, base_s=0.01)
    assert len(flaky.calls) == 1


@pytest.mark.django_db(transaction=True)
def test_retrying_stops_after_the_bounded_total():
    flaky = fail_first(10_000, lambda: "never")
    started = time.monotonic()
    with pytest.raises(OperationalError):
        retry_transient(flaky, what="x", max_s=0.5, base_s=0.01, cap_s=0.05)
    assert 0.5 <= time.monotonic() - started < 3
    assert len(flaky.calls) > 2


@pytest.mark.django_db(transaction=True)
def test_a_statement_past_its_answer_by_deadline_fails_then_as_a_transient_error():
    """A statement held past the request's deadline (behind PgBouncer: for
    the whole outage) fails when the deadline comes, as a transient error
    the request answers with what it has; the cut connection is closed and
    the next statement opens a new one. A block that ends in time cuts
    nothing."""
    from django.db import connection

    from core.transient import TRANSIENT_DB_ERRORS, answer_by

    started = time.monotonic()
    with (
        pytest.raises(TRANSIENT_DB_ERRORS),
        answer_by(time.monotonic() + 0.5),
        connection.cursor() as cur,
    ):
        cur.execute("SELECT pg_sleep(5)")
    assert time.monotonic() - started < 3
    assert connection.connection is None
    with answer_by(time.monotonic() + 30), connection.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
    live = connection.connection
    with connection.cursor() as cur:
        cur.execute("SELECT 2")
        assert cur.fetchone() == (2,)
    assert connection.connection is live


def test_a_connect_a_pooler_holds_ends_by_the_deadline_too(django_db_blocker):
    """PgBouncer holds a client's login while it cannot reach the server:
    a connect inside ``answer_by`` times out by the deadline (psycopg's 2 s
    floor), not by ``DB_CONNECT_TIMEOUT_S`` (5 s)."""
    import socket

    from django.db import connections

    from core.transient import TRANSIENT_DB_ERRORS, answer_by

    # Accepts connections (the kernel's backlog) and never answers one.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        connections.databases["held"] = {
            **connections.databases["default"],
            "HOST": "127.0.0.1",
            "PORT": port,
        }
        try:
            started = time.monotonic()
            deadline = time.monotonic() + 0.5
            with (
                django_db_blocker.unblock(),
                pytest.raises(TRANSIENT_DB_ERRORS),
                answer_by(deadline, using="held"),
            ):
                connections["held"].ensure_connection()
            assert time.monotonic() - started < 4
        finally:
            connections["held"].close()
            del connections.databases["held"]


def test_a_wrapped_connection_error_is_transient():
    try:
        try:
            raise OperationalError(LOST)
        except OperationalError as inner:
            raise RuntimeError("task failed") from inner
    except RuntimeError as outer:
        assert is_transient(outer)
    assert not is_transient(IntegrityError("duplicate key"))


# --- finish ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_finish_whose_commit_lost_its_reply_is_recorded_exactly_once(
    make_endpoint, monkeypatch, caplog
):
    make_endpoint("blip")
    ticket = admit_ticket(endpoint="blip", input={"n": 1}).ticket
    flaky = lose_reply_once(runtime.finish_turn)
    monkeypatch.setattr(execute, "finish_turn", flaky)

    with caplog.at_level(logging.WARNING):
        turn_id = runtime.run_ticket(ticket_id=ticket.id)

    assert len(flaky.calls) == 2  # retried once, after the committed attempt
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "succeeded" and t.result == {"echo": {"n": 1}}
    kinds = list(LedgerEvent.objects.filter(ticket=t).values_list("kind", flat=True))
    assert kinds.count("turn_started") == 1 and kinds.count("turn_completed") == 1
    assert "stale_outcome" not in kinds
    assert ContextEntry.objects.filter(turn_id=turn_id).count() == 1
    assert Turn.objects.get(id=turn_id).state == "completed"
    assert EndpointLock.objects.get(endpoint__address="blip").holder_id is None
    turn = Turn.objects.get(id=turn_id)
    assert any(
        str(turn.id) in r.getMessage() and f"seq {turn.seq}" in r.getMessage()
        for r in caplog.records
        if r.name == "core.transient" and r.levelno == logging.WARNING
    )


@pytest.mark.django_db(transaction=True)
def test_a_finish_that_started_the_next_turn_and_lost_its_reply_runs_that_turn(
    make_endpoint, monkeypatch
):
    """A backlog: the first finish commits, starting the next ticket's turn in
    its transaction, and its reply is lost. The retry finds the outcome
    recorded and the turn it started (this task, this process): that turn
    runs, nothing is started twice, nothing goes through the broker."""
    purge_broker()
    make_endpoint("blip-chain")
    ids = [admit_ticket(endpoint="blip-chain", input={"n": i}).ticket.id for i in range(3)]
    flaky = lose_reply_once(runtime.finish_turn)
    monkeypatch.setattr(execute, "finish_turn", flaky)

    runtime.run_ticket(ticket_id=ids[0], celery_task_id="task-chain", keep_going=lambda: True)

    assert len(flaky.calls) == 4  # three finishes, the first one twice
    tickets = Ticket.objects.filter(id__in=ids)
    assert {t.state for t in tickets} == {"succeeded"}
    assert Turn.objects.filter(ticket_id__in=ids).count() == 3
    assert TicketEvent.objects.filter(ticket_id__in=ids, kind="turn_started").count() == 3
    assert started_in_a_finish(ids) == ids[1:]
    assert queued_tasks("turns") == []
    assert EndpointLock.objects.get(endpoint__address="blip-chain").holder_id is None


@pytest.mark.django_db(transaction=True)
def test_a_different_outcome_for_an_ended_turn_is_still_stale_evidence(make_endpoint):
    make_endpoint("blip2")
    ticket = admit_ticket(endpoint="blip2", input={}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    turn = started.turn
    first = runtime.finish_turn(
        turn_id=turn.id, seq=turn.seq, outcome=Outcome.success({"a": 1}), source="worker"
    )
    again = runtime.finish_turn(
        turn_id=turn.id, seq=turn.seq, outcome=Outcome.success({"a": 1}), source="worker"
    )
    other = runtime.finish_turn(
        turn_id=turn.id, seq=turn.seq, outcome=Outcome.success({"a": 2}), source="worker"
    )
    assert first.accepted and not first.duplicate
    assert again.accepted and again.duplicate and again.ticket_state == "succeeded"
    assert not other.accepted
    assert TicketEvent.objects.filter(ticket=ticket, kind="stale_outcome").count() == 1
    assert Ticket.objects.get(id=ticket.id).result == {"a": 1}
    with pytest.raises(StaleTurn):
        runtime.finish_turn(
            turn_id=turn.id,
            seq=turn.seq + 1,
            outcome=Outcome.success({"a": 1}),
            source="api",
            strict=True,
        )


@pytest.mark.django_db(transaction=True)
def test_a_repeated_failure_or_wait_outcome_is_recognised_too(make_endpoint):
    make_endpoint("demo.echo")
    make_endpoint("lab", path="runtime.demo.research")
    make_endpoint("broken", path="runtime.demo.fail")
    for address, expected in (("lab", "waiting"), ("broken", "failed")):
        ticket = admit_ticket(endpoint=address, input={"children": 1}).ticket
        started = runtime.start_turn(ticket_id=ticket.id)
        ctx_outcome = (
            Outcome("wait", wait=runners.Wait(children=[], continuation={"k": 1}))
            if address == "lab"
            else Outcome.failure({"code": "boom", "detail": "boom"})
        )
        if address == "lab":
            ctx_outcome.wait.children.append(runners.Child(endpoint="demo.echo", input={"part": 0}))
        for _ in range(2):
            done = runtime.finish_turn(
                turn_id=started.turn.id, seq=started.turn.seq, outcome=ctx_outcome, source="worker"
            )
            assert done.accepted and done.ticket_state == expected
        assert not TicketEvent.objects.filter(ticket=ticket, kind="stale_outcome").exists()
        assert ContextEntry.objects.filter(turn=started.turn).count() == 1
    assert Ticket.objects.filter(parent__endpoint__address="lab").count() == 1


# --- start -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_start_whose_commit_lost_its_reply_runs_the_turn_it_started(make_endpoint, monkeypatch):
    make_endpoint("blip3")
    ticket = admit_ticket(endpoint="blip3", input={"n": 3}).ticket
    flaky = lose_reply_once(runtime.start_turn)
    monkeypatch.setattr(execute, "start_turn", flaky)

    turn_id = runtime.run_ticket(ticket_id=ticket.id, celery_task_id="task-lost-reply")

    assert turn_id is not None and len(flaky.calls) == 1  # found its turn, no second start
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "succeeded" and t.result == {"echo": {"n": 3}}
    assert Turn.objects.filter(ticket=t).count() == 1
    assert TicketEvent.objects.filter(ticket=t, kind="turn_started").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_start_that_did_not_commit_is_simply_tried_again(make_endpoint, monkeypatch):
    make_endpoint("blip4")
    ticket = admit_ticket(endpoint="blip4", input={}).ticket
    flaky = fail_first(2, runtime.start_turn)
    monkeypatch.setattr(execute, "start_turn", flaky)
    runtime.run_ticket(ticket_id=ticket.id, celery_task_id="task-2")
    assert Ticket.objects.get(id=ticket.id).state == "succeeded"
    assert len(flaky.calls) == 3


# --- heartbeat -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_survives_database_errors_and_beats_again(make_endpoint, monkeypatch):
    make_endpoint("blip5")
    ticket = admit_ticket(endpoint="blip5", input={}).ticket
    turn = runtime.start_turn(ticket_id=ticket.id).turn
    before = Turn.objects.get(id=turn.id).heartbeat_at
    flaky = fail_first(3, runtime.heartbeat)
    monkeypatch.setattr(heartbeats, "heartbeat", flaky)
    beater = heartbeats.Heartbeater(turn, 0.05, threading.Event())
    beater.start()
    try:
        wait_for(
            lambda: Turn.objects.get(id=turn.id).heartbeat_at > before,
            timeout=10,
            message="a heartbeat after three failed ones",
        )
        assert len(flaky.calls) >= 4
    finally:
        beater.stop()


@pytest.mark.django_db(transaction=True)
def test_the_turn_keeps_heartbeating_while_its_finish_is_retried(make_endpoint, monkeypatch):
    """The finish waits out the outage; the sweep must not take the silence
    for a dead worker meanwhile."""
    make_endpoint("blip7", heartbeat_timeout_s=1)  # a beat every 0.33 s
    ticket = admit_ticket(endpoint="blip7", input={}).ticket
    real = runtime.finish_turn
    seen = []  # the turn's heartbeat_at at each attempt
    first_at = []

    def finish_after_a_while(**kwargs):
        seen.append(Turn.objects.get(id=kwargs["turn_id"]).heartbeat_at)
        first_at[:] = first_at or [time.monotonic()]
        if time.monotonic() - first_at[0] < 1.5:
            raise OperationalError("could not serialize access due to concurrent update")
        return real(**kwargs)

    monkeypatch.setattr(execute, "finish_turn", finish_after_a_while)
    runtime.run_ticket(ticket_id=ticket.id)
    assert Ticket.objects.get(id=ticket.id).state == "succeeded"
    assert seen[-1] > seen[0]  # heartbeats landed between the first and the last attempt


@pytest.mark.django_db(transaction=True)
def test_a_runner_heartbeat_during_an_outage_does_not_fail_the_runner(make_endpoint, monkeypatch):
    make_endpoint("blip6")
    ticket = admit_ticket(endpoint="blip6", input={}).ticket
    turn = runtime.start_turn(ticket_id=ticket.id).turn
    monkeypatch.setattr(heartbeats, "heartbeat", fail_first(1, runtime.heartbeat))
    beater = heartbeats.Heartbeater(turn, 60, threading.Event())
    assert beater.beat() is False  # the blip: no exception into the runner
    assert beater.beat() is False  # and the next one reaches the database


@pytest.mark.django_db(transaction=True)
def test_a_childs_finish_that_lost_its_reply_sends_one_callback(make_endpoint, monkeypatch):
    make_endpoint("demo.echo")
    make_endpoint("lab", path="runtime.demo.research")
    root = admit_ticket(endpoint="lab", input={"children": 1}).ticket
    runtime.run_ticket(ticket_id=root.id)
    [child] = Ticket.objects.filter(parent=root)
    monkeypatch.setattr(execute, "finish_turn", lose_reply_once(runtime.finish_turn))
    runtime.run_ticket(ticket_id=child.id)
    assert Ticket.objects.get(id=child.id).state == "succeeded"
    assert Ticket.objects.filter(callback_for=child).count() == 1
    assert not TicketEvent.objects.filter(ticket=child, kind="stale_outcome").exists()


@pytest.mark.django_db(transaction=True)
def test_a_start_that_gives_up_leaves_the_ticket_to_the_lost_dispatch_sweep(
    make_endpoint, monkeypatch, settings
):
    """The message is used up; nothing was written; the sweep publishes the
    ticket again once the database is back."""
    from tests.conftest import purge_broker, queued_tasks

    purge_broker()
    make_endpoint("blip8")
    ticket = admit_ticket(endpoint="blip8", input={}).ticket
    purge_broker()  # the admission's own message: consumed by the failed start below
    settings.FINISH_RETRY_MAX_S = 0.3
    monkeypatch.setattr(execute, "start_turn", fail_first(10_000, runtime.start_turn))
    with pytest.raises(OperationalError):
        runtime.run_ticket(ticket_id=ticket.id, celery_task_id="task-3")
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "queued" and not Turn.objects.filter(ticket=t).exists()
    settings.REDISPATCH_AFTER_S = 0
    assert runtime.sweep_lost_dispatches() == [ticket.id]
    assert ("runtime.run_ticket", [str(ticket.id)]) in queued_tasks("turns")


# --- reads between start and finish -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_the_history_read_before_an_isolated_turn_waits_out_an_outage(
    make_endpoint, monkeypatch, isolation
):
    """The fault suite found it: a PostgreSQL restart met the supervisor's read
    of the endpoint's history (an isolated turn's process has no database:
    it asks the supervisor), the task raised, and the started turn was left
    to the budget sweep, which quarantined a healthy endpoint. The read is
    retried like start and finish."""
    make_endpoint(
        "blip-history", path="tests.endpoints.warm_runners.reads_history", isolation=isolation
    )
    ticket = admit_ticket(endpoint="blip-history", input={"h": 1}).ticket
    flaky = fail_first(2, execute.recent_history)
    monkeypatch.setattr(execute, "recent_history", flaky)

    runtime.run_ticket(ticket_id=ticket.id, celery_task_id="task-history")

    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "succeeded" and t.result == {"echo": {"h": 1}, "history": 0}
    assert len(flaky.calls) == 3
