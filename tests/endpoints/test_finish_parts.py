"""The parts of ``claimcheck_finish_turn`` (tickets/sql/), each called
directly on a real running turn: the guard, the decision, what the move
owes and the write (the parts every move of a ticket shares with
``claimcheck_ticket_move``), the duty after it, and the rule "answers a
requester" (root-like). The whole function's behaviour is
tests/endpoints/test_turn_functions.py's."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction

from runtime import turns as runtime
from runtime.runners import Outcome
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent, Turn

pytestmark = pytest.mark.django_db


def _running(make_endpoint, address, n=1):
    make_endpoint(address)
    ticket = admit_ticket(endpoint=address, input={"x": n}).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None
    return started.ticket.id, started.turn.id


ROWS = """
    (SELECT t FROM tickets_ticket t WHERE t.id = %(ticket)s),
    (SELECT l FROM runtime_endpointlock l JOIN runtime_turn u ON u.endpoint_id = l.endpoint_id
     WHERE u.id = %(turn)s),
    (SELECT u FROM runtime_turn u WHERE u.id = %(turn)s)
"""


def _guard(ticket, turn, seq, digest="d1"):
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT g.o_verdict, g.o_reason FROM (SELECT {ROWS}) r(t, l, u),
                claimcheck_finish_guard(p_ticket => r.t, p_lock => r.l, p_turn => r.u,
                    p_seq => %(seq)s, p_digest => %(digest)s) g""",
            {"ticket": ticket, "turn": turn, "seq": seq, "digest": digest},
        )
        return cur.fetchone()


def test_the_guard_knows_the_exact_turn_a_stale_seq_and_a_duplicate(make_endpoint):
    ticket, turn = _running(make_endpoint, "parts.guard")
    seq = Turn.objects.get(id=turn).seq
    assert _guard(ticket, turn, seq) == (
        "exact",
        f"turn {turn} is not the exact turn of ticket {ticket}",
    )
    verdict, reason = _guard(ticket, turn, seq + 1)
    assert verdict == "stale" and f"seq {seq + 1} vs current {seq}" in reason
    done = runtime.finish_turn(
        turn_id=turn, seq=seq, outcome=Outcome.success({"ok": 1}), source="test"
    )
    digest = TicketEvent.objects.get(ticket_id=ticket, kind="turn_completed").detail[
        "outcome_sha256"
    ]
    assert done.accepted
    assert _guard(ticket, turn, seq, digest)[0] == "duplicate"  # the same outcome again
    verdict, reason = _guard(ticket, turn, seq, "another")
    assert verdict == "stale" and f"turn {turn} is completed" in reason


def _decide(ticket, turn, kind, **kw):
    params = {"ticket": ticket, "turn": turn, "kind": kind, "result": None, "error": None,
              "evidence": None, "children": None, "ran_s": None, "returned_by": None}  # fmt: skip
    params.update(kw)
    for key in ("result", "error", "evidence", "children"):
        params[key] = None if params[key] is None else json.dumps(params[key])
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT d.o_turn_state, d.o_to, d.o_kind, d.o_detail, d.o_error, d.o_result,
                    d.o_context, d.o_stop_evidence IS NOT NULL
                FROM (SELECT {ROWS}) r(t, l, u),
                claimcheck_finish_outcome(p_ticket => r.t, p_turn => r.u, p_kind => %(kind)s,
                    p_result => %(result)s::jsonb, p_artifacts => NULL, p_error => %(error)s::jsonb,
                    p_evidence => %(evidence)s::jsonb, p_children => %(children)s::jsonb,
                    p_continuation => NULL, p_digest => 'd', p_ran_s => %(ran_s)s,
                    p_timing => '{{}}', p_returned_by => %(returned_by)s,
                    p_now => clock_timestamp()) d""",
            params,
        )
        row = cur.fetchone()
    names = ("turn", "to", "kind", "detail", "error", "result", "context", "stopped")
    # Django's connection leaves jsonb as text.
    return {k: json.loads(v) if isinstance(v, str) and k not in ("turn", "to", "kind") else v
            for k, v in zip(names, row, strict=True)}  # fmt: skip


def test_the_decision_reads_the_outcome_and_writes_nothing(make_endpoint):
    ticket, turn = _running(make_endpoint, "parts.decide")
    ok = _decide(ticket, turn, "success", result={"a": 1})
    assert (ok["turn"], ok["to"], ok["kind"], ok["result"], ok["context"]) == (
        "completed", "succeeded", "turn_completed", {"a": 1}, {"a": 1},
    )  # fmt: skip
    failed = _decide(ticket, turn, "failure", error={"code": "boom"})
    assert (failed["turn"], failed["to"], failed["error"]) == ("failed", "failed", {"code": "boom"})
    waits = _decide(ticket, turn, "wait", children=["c1"])
    assert (waits["turn"], waits["to"], waits["kind"]) == (
        "completed", "waiting", "waiting_for_children",
    )  # fmt: skip
    assert waits["context"] == {"waiting_for": ["c1"]}
    stopped = _decide(ticket, turn, "stopped", evidence={"kind": "process_exit", "detail": {}})
    assert (stopped["turn"], stopped["to"], stopped["kind"], stopped["stopped"]) == (
        "stopped", "failed", "turn_stopped", True,
    )  # fmt: skip
    assert stopped["error"]["code"] == "stopped"
    assert Ticket.objects.get(id=ticket).state == "running"  # nothing written
    assert Turn.objects.get(id=turn).state == "running"


def test_the_decision_of_an_interrupted_turn_is_a_stop_unless_the_outcome_was_late(
    make_endpoint,
):
    ticket, turn = _running(make_endpoint, "parts.late")
    t = Turn.objects.get(id=turn)
    assert runtime.request_interrupt(turn_id=turn, seq=t.seq, reason="deadline", actor="test")
    t.refresh_from_db()
    stop = _decide(ticket, turn, "success", result={"a": 1})
    assert (stop["turn"], stop["to"]) == ("stopped", "failed")
    assert stop["error"]["code"] == "timed_out"
    # The runner returned before the interrupt was requested: applied.
    late = _decide(ticket, turn, "success", result={"a": 1}, ran_s=0.0, returned_by=t.started_at)
    assert (late["turn"], late["to"]) == ("completed", "succeeded")
    assert late["detail"]["late"]["reason"] == "deadline"


WRITE_FAILED = f"""SELECT claimcheck_finish_write(p_ticket => r.t, p_turn => r.u,
        p_turn_state => 'failed', p_to => 'failed', p_kind => 'turn_failed',
        p_detail => '{{"why": 1}}', p_error => '{{"code": "x"}}', p_result => NULL,
        p_artifacts => NULL, p_context => '{{"error": 1}}', p_stop_evidence => NULL,
        p_delivery_state => NULL, p_actor => 'test', p_now => clock_timestamp(),
        p_node => '', p_pid => 0)
    FROM (SELECT {ROWS}) r(t, l, u)"""


def test_the_write_refuses_a_ticket_that_is_not_running(make_endpoint):
    """Its answer is False (the finish then raises, undoing the rest); here
    the running turn is paired with another ticket, still queued."""
    ticket, turn = _running(make_endpoint, "parts.write")
    paired = ROWS.replace("t.id = %(ticket)s", "t.id = %(queued)s")
    queued = admit_ticket(endpoint="parts.write", input={"x": 2}).ticket
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""SELECT claimcheck_finish_write(p_ticket => r.t, p_turn => r.u,
                    p_turn_state => 'completed', p_to => 'succeeded', p_kind => 'turn_completed',
                    p_detail => '{{}}', p_error => NULL, p_result => NULL, p_artifacts => NULL,
                    p_context => NULL, p_stop_evidence => NULL, p_delivery_state => NULL,
                    p_actor => 'test', p_now => clock_timestamp(), p_node => '', p_pid => 0)
                FROM (SELECT {paired}) r(t, l, u)""",
            {"ticket": ticket, "turn": turn, "queued": queued.id},
        )
        assert cur.fetchone() == (False,)
        transaction.set_rollback(True)
    assert not TicketEvent.objects.filter(ticket_id=queued.id, kind="turn_completed").exists()
    assert Ticket.objects.get(id=queued.id).state == "queued"


def test_the_write_ends_the_turn_and_moves_the_ticket_with_its_event(make_endpoint):
    ticket, turn = _running(make_endpoint, "parts.write2")
    with connection.cursor() as cur:
        cur.execute(WRITE_FAILED, {"ticket": ticket, "turn": turn})
        assert cur.fetchone() == (True,)
    t = Ticket.objects.get(id=ticket)
    assert (t.state, t.error, Turn.objects.get(id=turn).state) == (
        "failed",
        {"code": "x"},
        "failed",
    )
    event = TicketEvent.objects.get(ticket_id=ticket, kind="turn_failed")
    assert (event.from_state, event.to_state, event.detail) == ("running", "failed", {"why": 1})


def _owes(ticket, to):
    with connection.cursor() as cur:
        cur.execute(
            """SELECT w.o_detail, w.o_delivery IS NOT NULL, w.o_delivery_state, w.o_due, w.o_rerun
               FROM (SELECT t FROM tickets_ticket t WHERE t.id = %s) r(t),
               claimcheck_ticket_owes(p_ticket => r.t, p_to => %s, p_detail => '{"k": 1}',
                   p_delivery => gen_random_uuid(), p_now => clock_timestamp()) w""",
            [ticket, to],
        )
        detail, opened, state, due, rerun = cur.fetchone()
    return json.loads(detail) if isinstance(detail, str) else detail, opened, state, due, rerun


def test_what_a_move_owes_is_a_terminal_roots_delivery_once(make_endpoint):
    """claimcheck_ticket_owes: a ticket that stays open owes nothing; a
    terminal root opens its delivery (recorded on the event's detail), and
    only once; a child owes none (its parent answers)."""
    ticket, _ = _running(make_endpoint, "parts.owes")
    assert _owes(ticket, "waiting") == ({"k": 1}, False, None, False, None)
    opened = {"k": 1, "delivery_opened": {"mode": "pull", "state": "pending"}}
    assert _owes(ticket, "failed") == (opened, True, "pending", False, None)
    assert _owes(ticket, "failed") == ({"k": 1}, False, None, False, None)  # open already
    child = admit_ticket(endpoint="parts.owes", input={"c": 1}, parent_id=ticket).ticket
    assert _owes(child.id, "cancelled") == ({"k": 1}, False, None, False, None)


def test_the_duty_after_releases_the_lock_and_names_the_next_ticket(make_endpoint):
    ticket, turn = _running(make_endpoint, "parts.next")
    queued = admit_ticket(endpoint="parts.next", input={"x": 2}).ticket
    endpoint = Ticket.objects.get(id=ticket).endpoint_id
    with connection.cursor() as cur:
        cur.execute(WRITE_FAILED, {"ticket": ticket, "turn": turn})  # the part before
        cur.execute(
            """SELECT n.o_next, n.o_next_turn IS NULL FROM claimcheck_finish_next(
                   p_endpoint => %s, p_turn => %s, p_next_turn => NULL, p_task => '',
                   p_worker => '{}', p_next_token_sha256 => '', p_next_actor => '',
                   p_node => '', p_pid => 0) n""",
            [endpoint, turn],
        )
        assert cur.fetchone() == (queued.id, True)
    lock = EndpointLock.objects.get(endpoint_id=endpoint)
    assert (lock.holder_id, lock.token) == (None, None)


@pytest.mark.parametrize(
    ("parent", "rerun_of", "obligation", "root_like"),
    [
        (False, False, "open", True),  # a root
        (True, False, "none", False),  # a child: its parent answers
        (True, True, "open", True),  # a child's re-run carrying the obligation
        (True, True, "none", False),  # a child's re-run carrying none
    ],
)
def test_root_like_is_one_rule(parent, rerun_of, obligation, root_like):
    some = "00000000-0000-0000-0000-000000000001"
    with connection.cursor() as cur:
        cur.execute(
            "SELECT claimcheck_ticket_root_like(p_parent => %s, p_rerun_of => %s,"
            " p_obligation_state => %s)",
            [some if parent else None, some if rerun_of else None, obligation],
        )
        assert cur.fetchone() == (root_like,)
