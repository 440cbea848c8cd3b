"""A turn's start and finish, each one database function
(``claimcheck_start_turn``, ``claimcheck_finish_turn``: tickets/sql/),
against real PostgreSQL: one statement each, the
rows a turn leaves, and the guards under races (threads, real row locks):
two finishes of one turn, a stale ``seq``, a start racing a quarantine; and
the rows each reads, whatever the backlog."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from endpoints.models import Endpoint
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import wait_for
from tests.racing import race
from tickets.admission import admit_ticket
from tickets.models import (
    ContextEntry,
    Delivery,
    EndpointLock,
    LedgerEvent,
    Ticket,
    TicketEvent,
    Turn,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement turn is PostgreSQL's")


def _started(make_endpoint, address):
    make_endpoint(address)
    ticket = admit_ticket(endpoint=address, input={"x": 1}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    return started


def _shape(ticket_id):
    """What a turn left behind, without ids and clocks (the events' details
    carry neither: the turn's row keeps its deadline, the delivery's row its
    id)."""
    t = Ticket.objects.get(id=ticket_id)
    turn = Turn.objects.get(ticket_id=ticket_id)
    events = [
        (e.kind, e.from_state, e.to_state, e.actor.split(":")[0], e.detail)
        for e in LedgerEvent.objects.filter(ticket_id=ticket_id).order_by("id")
    ]
    entry = ContextEntry.objects.get(turn=turn)
    delivery = Delivery.objects.get(ticket_id=ticket_id)
    lock = EndpointLock.objects.get(endpoint_id=t.endpoint_id)
    return {
        "ticket": (t.state, t.result, t.error, t.artifacts, t.delivery_state),
        "turn": (turn.state, turn.seq, turn.runner_kind, turn.ended_at is not None),
        "events": events,
        "entry": (entry.seq, entry.input, entry.result, entry.artifacts),
        "delivery": (delivery.mode, delivery.url, delivery.next_attempt_at),
        "lock": (lock.holder_id, lock.token),
        "finished": t.finished_at is not None,
        "turn_of_ticket": t.turn_id == turn.id,
    }


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_a_finished_turn_leaves_its_rows(make_endpoint, outcome):
    started = _started(make_endpoint, f"shape-{outcome}")
    out = (
        Outcome.success({"ok": True})
        if outcome == "success"
        else Outcome.failure({"code": "boom", "detail": "x"})
    )
    done = runtime.finish_turn(
        turn_id=started.turn.id, seq=started.turn.seq, outcome=out, source="worker"
    )
    assert done.accepted and not done.duplicate
    shape = _shape(started.ticket.id)
    state, result, error, artifacts, delivery_state = shape["ticket"]
    if outcome == "success":
        assert (state, result, error, artifacts) == ("succeeded", {"ok": True}, None, [])
        assert shape["turn"][0] == "completed" and shape["entry"][2] == {"ok": True}
    else:
        assert (state, result) == ("failed", None) and error["code"] == "boom"
        assert shape["turn"][0] == "failed" and shape["entry"][2] == {"error": error}
    # queued -> running -> terminal, an event each (below); the delivery's state too.
    assert delivery_state == "pending"
    assert shape["delivery"] == ("pull", "", None)
    assert shape["lock"] == (None, None) and shape["finished"] and shape["turn_of_ticket"]
    admitted, started_event, terminal = shape["events"]
    assert started_event == ("turn_started", "queued", "running", "worker", {"seq": 1})
    assert terminal[:4] == (
        "turn_completed" if outcome == "success" else "turn_failed",
        "running",
        state,
        "turn",
    )
    assert terminal[4]["delivery_opened"] == {"mode": "pull", "state": "pending"}
    assert set(terminal[4]) == {"delivery_opened", "outcome_sha256"}


def test_start_and_finish_are_one_statement_each(make_endpoint):
    make_endpoint("one-each")
    ticket = admit_ticket(endpoint="one-each", input={}).ticket
    with CaptureQueriesContext(connection) as start_q:
        started = runtime.start_turn(ticket_id=ticket.id)
    assert started.ticket.state == "running" and started.turn.seq == 1
    assert started.endpoint.address == "one-each" and started.ticket.input == {}
    with CaptureQueriesContext(connection) as finish_q:
        runtime.finish_turn(
            turn_id=started.turn.id,
            seq=1,
            outcome=Outcome.success({}),
            source="worker",
            turn=started.turn,
        )
    assert len(start_q.captured_queries) == 1, start_q.captured_queries
    assert len(finish_q.captured_queries) == 1, finish_q.captured_queries
    assert "claimcheck_start_turn(" in start_q.captured_queries[0]["sql"]
    assert "claimcheck_finish_turn(" in finish_q.captured_queries[0]["sql"]
    assert Ticket.objects.get(id=ticket.id).state == "succeeded"


@pytest.mark.parametrize("same", [True, False], ids=["same-outcome", "other-outcome"])
def test_two_finishes_of_one_turn_apply_once(make_endpoint, same):
    for round_ in range(5):
        started = _started(make_endpoint, f"twice-{same}-{round_}".lower())
        a = Outcome.success({"n": 1})
        b = a if same else Outcome.success({"n": 2})

        def finish(outcome, started=started):
            return runtime.finish_turn(
                turn_id=started.turn.id, seq=started.turn.seq, outcome=outcome, source="worker"
            )

        results = race(lambda a=a: finish(a), lambda b=b: finish(b))
        applied = [r for r in results if r.accepted and not r.duplicate]
        assert len(applied) == 1, results
        other = next(r for r in results if r is not applied[0])
        assert other.duplicate if same else not other.accepted
        tid = started.ticket.id
        assert TicketEvent.objects.filter(ticket_id=tid, kind="turn_completed").count() == 1
        assert Delivery.objects.filter(ticket_id=tid).count() == 1
        assert ContextEntry.objects.filter(turn_id=started.turn.id).count() == 1
        assert EndpointLock.objects.get(endpoint_id=started.endpoint.id).holder_id is None


def test_a_stale_seq_changes_nothing(make_endpoint):
    started = _started(make_endpoint, "stale")
    before = Ticket.objects.get(id=started.ticket.id).updated_at
    done = runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq - 1,
        outcome=Outcome.success({}),
        source="worker",
    )
    assert not done.accepted
    t = Ticket.objects.get(id=started.ticket.id)
    assert t.state == "running" and t.updated_at == before
    assert Turn.objects.get(id=started.turn.id).state == "running"
    lock = EndpointLock.objects.get(endpoint_id=started.endpoint.id)
    assert lock.holder_id == started.turn.id and lock.token == started.turn.seq
    assert not Delivery.objects.filter(ticket_id=t.id).exists()
    # Recorded as evidence, and nothing else.
    assert TicketEvent.objects.filter(ticket_id=t.id, kind="stale_outcome").count() == 1


def test_a_start_waiting_on_a_quarantine_starts_nothing(make_endpoint):
    """The quarantine holds the endpoint row when the start statement reaches
    it: the start waits, re-reads the row after the commit, finds the
    endpoint quarantined and writes only the ticket's ``needs_dispatch``."""
    endpoint = make_endpoint("quarantine-race")
    ticket = admit_ticket(endpoint="quarantine-race", input={}).ticket
    Ticket.objects.filter(id=ticket.id).update(needs_dispatch=False)
    held = threading.Event()
    release = threading.Event()

    def quarantine():
        with transaction.atomic():
            Endpoint.objects.filter(id=endpoint.id).update(state="quarantined")
            held.set()
            assert release.wait(20)
        return "quarantined"

    def start():
        assert held.wait(20)
        return runtime.start_turn(ticket_id=ticket.id)

    def referee():
        wait_for(
            _someone_waits_on_a_lock, timeout=20, message="the start to wait on the endpoint row"
        )
        release.set()

    results = race(quarantine, start, referee)
    assert results[1] is None
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "queued" and t.needs_dispatch and t.turn_id is None
    assert not Turn.objects.filter(endpoint_id=endpoint.id).exists()
    assert Endpoint.objects.get(id=endpoint.id).turn_seq == 0
    assert EndpointLock.objects.get(endpoint_id=endpoint.id).holder_id is None


def test_starts_racing_on_one_endpoint_take_the_lock_once(make_endpoint):
    make_endpoint("start-race")
    ids = [admit_ticket(endpoint="start-race", input={"i": i}).ticket.id for i in range(4)]
    Ticket.objects.filter(id__in=ids).update(needs_dispatch=False)
    results = race(*[(lambda i=i: runtime.start_turn(ticket_id=i)) for i in ids])
    started = [r for r in results if r is not None]
    assert len(started) == 1
    # FIFO: the oldest queued ticket runs, whichever message got there.
    assert started[0].ticket.id == ids[0] and started[0].turn.seq == 1
    others = Ticket.objects.filter(id__in=ids[1:])
    assert all(t.state == "queued" for t in others)
    # Every message used up without its ticket starting left a mark.
    assert {t.id for t in others if t.needs_dispatch} == set(ids[1:])


def test_a_start_waiting_on_a_finish_holds_the_lock_it_finds_free(make_endpoint):
    """The finish holds the lock row (uncommitted) when the next start
    reaches it: the start waits, finds the lock free at the finish's commit,
    and its turn must then hold it (a statement's snapshot still shows the
    old holder)."""
    first = _started(make_endpoint, "handover")
    second = admit_ticket(endpoint="handover", input={"n": 2}).ticket
    finished = threading.Event()
    release = threading.Event()

    def finish():
        with transaction.atomic():
            done = runtime.finish_turn(
                turn_id=first.turn.id,
                seq=first.turn.seq,
                outcome=Outcome.success({}),
                source="worker",
            )
            finished.set()
            assert release.wait(20)
        return done

    def start():
        assert finished.wait(20)
        return runtime.start_turn(ticket_id=second.id)

    def referee():
        wait_for(_someone_waits_on_a_lock, timeout=20, message="the start to wait on the lock row")
        release.set()

    done, started, _ = race(finish, start, referee)
    assert done.accepted and started is not None
    assert started.ticket.id == second.id and started.turn.seq == first.turn.seq + 1
    lock = EndpointLock.objects.get(endpoint_id=first.endpoint.id)
    assert (lock.holder_id, lock.token) == (started.turn.id, started.turn.seq)
    assert Ticket.objects.get(id=second.id).state == "running"


def _someone_waits_on_a_lock():
    with connections["default"].cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        return cur.fetchone()[0] > 0


def _rows_read(call) -> int:
    """Rows of ``tickets_ticket`` that ``call`` read (sequential reads and
    index fetches, the ones a filter threw away included), in a transaction
    rolled back, with the generic plans a worker's session settles on (the
    functions' plans are cached per session, and a generic plan is chosen
    without the parameters' values)."""
    stats = (
        "SELECT COALESCE(sum(seq_tup_read + idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
        " WHERE relname = 'tickets_ticket'"
    )
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cur.execute(stats)
            before = cur.fetchone()[0]
            call()
            cur.execute(stats)
            after = cur.fetchone()[0]
        transaction.set_rollback(True)
    return after - before


def _plan_rows(sql: str, params: dict) -> list[tuple[str, int]]:
    """(node, actual rows x loops) of every plan node of ``sql``, run for
    real (EXPLAIN ANALYZE) and rolled back."""
    import json

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
            plan = cur.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    out, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        label = f"{node['Node Type']} {node.get('Index Name') or node.get('Relation Name') or ''}"
        out.append((label, node["Actual Rows"] * node["Actual Loops"]))
        stack.extend(node.get("Plans", []))
    return out


def _finish(started):
    return lambda: runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({}),
        source="worker",
        turn=started.turn,
    )


def _ledger_with_history(make_endpoint, address: str, turns: int = 60) -> None:
    """Finished tickets on an endpoint of their own: a ledger with history,
    as in production (the plan tests' statistics then see more than a queue)."""
    make_endpoint(address, isolation="inline")  # no fork per history turn
    for i in range(turns):
        runtime.run_ticket(ticket_id=admit_ticket(endpoint=address, input={"i": i}).ticket.id)


def test_a_start_reads_a_handful_of_rows_whatever_the_backlog(make_endpoint, owner_cursor):
    """Found by the benchmark (auto_explain): the start statement joined the
    ticket update to the new turn, and the planner, whose statistics showed
    one queued ticket, scanned the endpoint's whole queued index to find it
    (98 rows for a backlog of 98): O(backlog) per turn. By key, every node
    touches a handful of rows however many tickets wait, tk (the endpoint's
    oldest queued ticket) included since queued tickets are in
    ticket_queued_idx alone."""

    _ledger_with_history(make_endpoint, "history")
    make_endpoint("backlog")
    first = admit_ticket(endpoint="backlog", input={"i": -1}).ticket
    # Statistics taken while one ticket waits (as the owner: the application
    # role may not ANALYZE).
    owner_cursor.execute("ANALYZE tickets_ticket")
    for i in range(300):
        admit_ticket(endpoint="backlog", input={"i": i})
    read = _rows_read(lambda: runtime.start_turn(ticket_id=first.id))
    assert read <= 10, read


def test_a_turn_reads_nothing_of_another_endpoints_backlog(make_endpoint, owner_cursor):
    """Found by auto_explain: a start takes its endpoint's oldest
    queued ticket and a finish unmarks its next one, and with statistics
    taken before a backlog the generic plan found them through
    ``ticket_state_id_idx`` (state, id), walking every endpoint's queued
    tickets in id order and filtering on the endpoint: one hot endpoint's
    backlog read again by every other endpoint's every turn. Queued
    tickets are ``ticket_queued_idx``'s (endpoint, id), and only its."""

    _ledger_with_history(make_endpoint, "history4")
    owner_cursor.execute("ANALYZE tickets_ticket")  # statistics taken with nothing queued
    make_endpoint("hot")
    make_endpoint("quiet")
    for i in range(300):
        admit_ticket(endpoint="hot", input={"i": i})
    mine = admit_ticket(endpoint="quiet", input={}).ticket
    read = _rows_read(lambda: runtime.start_turn(ticket_id=mine.id))
    assert read <= 10, read

    started = runtime.start_turn(ticket_id=mine.id)
    read = _rows_read(_finish(started))
    assert read <= 10, read


def test_a_dispatcher_pass_reads_a_handful_of_rows_whatever_the_backlog(
    make_endpoint, owner_cursor
):
    """The pass used to collect the endpoints owed a message with a DISTINCT
    over every marked queued ticket: O(backlog) on every admission's
    wake-up. It now probes ticket_queued_idx once per endpoint with a queue
    (a loose index scan) and reads each free endpoint's oldest ticket."""
    from runtime.turns import dispatch

    _ledger_with_history(make_endpoint, "history2")
    make_endpoint("deep")
    make_endpoint("shallow")
    admit_ticket(endpoint="shallow", input={})
    for i in range(300):
        admit_ticket(endpoint="deep", input={"i": i})
    owner_cursor.execute("ANALYZE tickets_ticket")  # the application role may not
    rows = _plan_rows(dispatch._OWED_SQL, {"limit": 100})
    assert max(n for _, n in rows) <= 10, [r for r in rows if r[1] > 10]


def test_a_finish_reads_a_handful_of_rows_whatever_the_backlog(make_endpoint, owner_cursor):
    """Found by the benchmark (auto_explain): the finish unmarked the
    endpoint's next ticket with ``UPDATE … FROM w``, and with statistics
    taken before the backlog grew the planner walked every queued ticket to
    join it to ``w``: O(backlog) per turn, nearly all of a finish's time
    behind a long backlog. By key, every node touches a
    handful of rows however many tickets wait. The plan is the generic one a
    worker's session settles on."""

    _ledger_with_history(make_endpoint, "history3")
    owner_cursor.execute("ANALYZE tickets_ticket")  # statistics taken with nothing queued
    make_endpoint("backlog2")
    first = admit_ticket(endpoint="backlog2", input={"i": -1}).ticket
    admit_ticket(endpoint="backlog2", input={"i": 0})
    started = runtime.start_turn(ticket_id=first.id)
    for i in range(300):
        admit_ticket(endpoint="backlog2", input={"i": i + 1})
    read = _rows_read(_finish(started))
    assert read <= 10, read
