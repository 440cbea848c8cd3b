"""TicketEvent is append-only in the database itself: its triggers refuse
UPDATE and DELETE even to the owner of the table; the application role is
refused before that by its privileges (tests/test_database_roles.py)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, transaction

from tickets.admission import admit_ticket
from tickets.models import TicketEvent

# The owner's statements run on their own connection: the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def event(make_endpoint):
    make_endpoint("alpha")
    ticket = admit_ticket(endpoint="alpha", input={}).ticket
    return TicketEvent.objects.get(ticket_id=ticket.id)


def test_update_of_an_event_is_refused_by_the_database(event, owner_cursor):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute(
            "UPDATE tickets_ticketevent SET kind = 'forged' WHERE id = %s", [event.id]
        )
    assert TicketEvent.objects.get(id=event.id).kind == "admitted"


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
