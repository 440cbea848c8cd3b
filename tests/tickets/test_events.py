"""TicketEvent is append-only in the database itself: its triggers refuse
UPDATE and DELETE even to the owner of the table; the application role is
refused before that by its privileges (tests/test_database_roles.py).

An admission writes no event row: the ticket row implies its admission
event (``admission_event``, ``admission_actor``), which every reader reads
through LedgerEvent (the view ``tickets_ticketevent_all``) as it read the
row: same fields, an id of the events' one sequence, first of the ticket's.
While the previous release's ``claimcheck_admit`` is installed (until
``post_deploy``), its readers read the rows only, so the event is a row."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import DatabaseError, transaction

from tickets import selectors, streams
from tickets.admission import admit_ticket
from tickets.events import append_event
from tickets.lifecycle import request_cancel
from tickets.models import LedgerEvent, Ticket, TicketEvent
from tickets.selectors import event_payload, ticket_events

# The owner's statements run on their own connection: the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def event(make_endpoint):
    make_endpoint("alpha")
    ticket = admit_ticket(endpoint="alpha", input={}).ticket
    return append_event(ticket_id=ticket.id, kind="note")


def test_update_of_an_event_is_refused_by_the_database(event, owner_cursor):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute(
            "UPDATE tickets_ticketevent SET kind = 'forged' WHERE id = %s", [event.id]
        )
    assert TicketEvent.objects.get(id=event.id).kind == "note"


def test_delete_of_an_event_is_refused_by_the_database(event, owner_cursor):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute("DELETE FROM tickets_ticketevent WHERE id = %s", [event.id])
    assert TicketEvent.objects.filter(id=event.id).exists()


def test_orm_bulk_update_is_refused_too(event):
    with pytest.raises(DatabaseError), transaction.atomic():
        TicketEvent.objects.filter(id=event.id).update(actor="someone else")
    assert TicketEvent.objects.get(id=event.id).actor == ""


def test_events_can_still_be_appended(event):
    TicketEvent.objects.create(ticket_id=event.ticket_id, kind="note", at=event.at)
    assert TicketEvent.objects.filter(ticket_id=event.ticket_id).count() == 2


# --- The admission event the ticket row implies -------------------------------------------------


def test_an_admission_writes_no_event_row_and_every_reader_sees_its_event(make_endpoint):
    make_endpoint("alpha")
    before = append_event(ticket_id=admit_ticket(endpoint="alpha", input={}).ticket.id, kind="x")
    root = admit_ticket(endpoint="alpha", input={}, actor="user:someone").ticket
    child = admit_ticket(endpoint="alpha", input={}, parent_id=root.id, actor="turn:1").ticket
    after = append_event(ticket_id=root.id, kind="note", actor="y")

    assert list(TicketEvent.objects.filter(ticket_id__in=[root.id, child.id])) == [after]
    row = Ticket.objects.get(id=root.id)
    [admitted, note] = ticket_events(root.id)
    # One sequence for the whole ledger: after what was written before the
    # admission, before anything written after it.
    assert before.id < admitted.id == row.admission_event < note.id == after.id
    assert event_payload(admitted) == {
        "kind": "admitted",
        "from_state": "",
        "to_state": "queued",
        "actor": "user:someone",
        "turn": None,
        "detail": {},
        "at": event_payload(admitted)["at"],
    }
    assert admitted.at == row.created_at
    [child_admitted] = ticket_events(child.id)
    assert (child_admitted.actor, child_admitted.detail) == ("turn:1", {"parent": str(root.id)})
    assert selectors.change_token(child.id) == str(child_admitted.id)
    assert selectors.change_token(root.id) == str(after.id)


def test_the_event_is_a_row_while_the_previous_release_may_read_the_ledger(
    make_endpoint, owner_cursor
):
    """Its ``claimcheck_admit`` installed: an admission writes the event row
    (and no implied one), which the view shows once."""
    make_endpoint("alpha")
    owner_cursor.execute(
        "CREATE FUNCTION claimcheck_admit() RETURNS int LANGUAGE sql AS 'SELECT 1'"
    )
    try:
        ticket = admit_ticket(endpoint="alpha", input={}, actor="user:old").ticket
    finally:
        owner_cursor.execute("DROP FUNCTION claimcheck_admit()")
    row = Ticket.objects.get(id=ticket.id)
    assert (row.admission_event, row.admission_actor) == (None, "")
    stored = TicketEvent.objects.get(ticket_id=ticket.id)
    [seen] = ticket_events(ticket.id)
    assert (seen.id, seen.kind, seen.actor, seen.at) == (
        stored.id,
        "admitted",
        "user:old",
        stored.at,
    )
    # And once it is dropped (post_deploy), the next admission implies it.
    nxt = admit_ticket(endpoint="alpha", input={}).ticket
    assert not TicketEvent.objects.filter(ticket_id=nxt.id).exists()
    assert [e.kind for e in ticket_events(nxt.id)] == ["admitted"]


def test_an_implied_event_is_written_once(make_endpoint, owner_cursor):
    make_endpoint("alpha")
    ticket = admit_ticket(endpoint="alpha", input={}, actor="user:a").ticket
    for column, value in (("admission_actor", "user:forged"), ("admission_event", 1)):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="written once"):
            owner_cursor.execute(
                f"UPDATE tickets_ticket SET {column} = %s WHERE id = %s", [value, ticket.id]
            )
    # The row's other changes go on (the trigger looks at these two only).
    Ticket.objects.filter(id=ticket.id).update(obligation_note="n")
    Ticket.objects.get(id=ticket.id).save()
    assert ticket_events(ticket.id)[0].actor == "user:a"


def _messages(ticket_id, after: int) -> list[tuple[int | None, str]]:
    out = []
    for chunk in streams.steps(ticket_id, after=after):
        head = dict(line.split(": ", 1) for line in chunk.decode().splitlines() if ": " in line)
        if "event" in head:
            out.append((int(head["id"]) if "id" in head else None, head["event"]))
            json.loads(head["data"])
    return out


def test_the_stream_sends_the_implied_admission_and_resumes_after_it(make_endpoint):
    make_endpoint("alpha")
    ticket = admit_ticket(endpoint="alpha", input={}, actor="user:a").ticket
    request_cancel(ticket_id=ticket.id, actor="user:a")
    [admitted, cancelled] = ticket_events(ticket.id)
    assert _messages(ticket.id, after=0) == [
        (admitted.id, "admitted"),
        (cancelled.id, "cancelled"),
        (None, "end"),
    ]
    assert _messages(ticket.id, after=admitted.id) == [(cancelled.id, "cancelled"), (None, "end")]
    assert _messages(ticket.id, after=cancelled.id) == [(None, "end")]


def test_the_ledger_token_moves_with_an_admission(make_endpoint):
    make_endpoint("alpha")
    first = selectors.ledger_change_token()
    ticket = admit_ticket(endpoint="alpha", input={}).ticket
    moved = selectors.ledger_change_token()
    assert moved != first
    assert moved == str(LedgerEvent.objects.get(ticket_id=ticket.id).id)
    assert selectors.ledger_change_token() == moved  # nothing changed since
