"""The state machines' edges, written once in Python and enforced by the
database for every writer (core/edges.py): the generated files are what the
Python edges give, and a change of state along no edge is refused even by
a raw UPDATE."""

from __future__ import annotations

import itertools

import pytest
from django.db import IntegrityError, connection, transaction

from config.management.commands.generate_edges import MACHINES, stale
from runtime import turns as runtime
from runtime.runners import Outcome
from tickets.admission import admit_ticket
from tickets.machines import TURN_EDGES
from tickets.models import TICKET_EDGES, Ticket, TicketState, Turn, TurnState


def test_the_generated_files_are_what_the_python_edges_give():
    wanted = stale()
    assert not wanted, "stale (run `python manage.py generate_edges`): " + ", ".join(
        map(str, wanted)
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("check", "states", "edges", "births"),
    [
        ("claimcheck_ticket_edge_ok", TicketState, TICKET_EDGES, {("", "queued")}),
        ("claimcheck_turn_edge_ok", TurnState, TURN_EDGES, set()),
    ],
)
def test_the_database_check_agrees_with_the_python_edges_on_every_pair(
    check, states, edges, births
):
    names = ["", *map(str, states)]
    pairs = list(itertools.product(names, names))
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT f, t, {check}(p_from => f, p_to => t)"
            " FROM unnest(%s::text[], %s::text[]) x(f, t)",
            [[f for f, _ in pairs], [t for _, t in pairs]],
        )
        said = {(f, t): ok for f, t, ok in cur.fetchall()}
    want = {(f, t): (f, t) in births or (f != "" and t in edges[f]) for f, t in pairs}
    assert said == want


def test_every_machine_is_generated():
    assert {m.name for m, _ in MACHINES} == {"ticket", "turn"}


def _finished(address: str) -> tuple[Ticket, Turn]:
    ticket = admit_ticket(endpoint=address, input={"n": 1}, actor="test").ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({"ok": True}),
        source="test",
    )
    return Ticket.objects.get(id=ticket.id), Turn.objects.get(id=started.turn.id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("table", "to", "row", "refused"),
    [
        ("tickets_ticket", "running", "ticket", "succeeded -> running"),
        ("tickets_ticket", "queued", "ticket", "succeeded -> queued"),
        ("runtime_turn", "running", "turn", "completed -> running"),
        ("runtime_turn", "stopped", "turn", "completed -> stopped"),
    ],
)
def test_a_forbidden_transition_by_raw_sql_is_refused(make_endpoint, table, to, row, refused):
    make_endpoint("edges.raw")
    ticket, turn = _finished("edges.raw")
    with (
        pytest.raises(IntegrityError, match=f"no edge {refused} in the"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        ids = {"ticket": ticket.id, "turn": turn.id}
        cur.execute(f"UPDATE {table} SET state = %s WHERE id = %s", [to, ids[row]])
    ticket.refresh_from_db()
    turn.refresh_from_db()
    assert (ticket.state, turn.state) == (TicketState.SUCCEEDED, TurnState.COMPLETED)


@pytest.mark.django_db
def test_an_allowed_transition_and_a_write_that_keeps_the_state_pass(make_endpoint):
    make_endpoint("edges.ok")
    queued = admit_ticket(endpoint="edges.ok", input={"n": 2}, actor="test").ticket
    with connection.cursor() as cur:
        # Not a transition: the state stays (the guard looks at changes only).
        cur.execute("UPDATE tickets_ticket SET state = state WHERE id = %s", [queued.id])
        cur.execute("UPDATE tickets_ticket SET state = 'cancelled' WHERE id = %s", [queued.id])
    assert Ticket.objects.get(id=queued.id).state == TicketState.CANCELLED
