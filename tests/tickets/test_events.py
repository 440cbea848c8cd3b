"""TicketEvent is append-only in the database itself."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from tickets.admission import admit_ticket
from tickets.models import TicketEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(make_endpoint):
    make_endpoint("alpha")
    ticket = admit_ticket(endpoint="alpha", input={}).ticket
    return TicketEvent.objects.get(ticket_id=ticket.id)


def test_update_of_an_event_is_refused_by_the_database(event):
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        cur.execute("UPDATE tickets_ticketevent SET kind = 'forged' WHERE id = %s", [event.id])
    assert TicketEvent.objects.get(id=event.id).kind == "admitted"


def test_delete_of_an_event_is_refused_by_the_database(event):
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        cur.execute("DELETE FROM tickets_ticketevent WHERE id = %s", [event.id])
    assert TicketEvent.objects.filter(id=event.id).exists()


def test_orm_bulk_update_is_refused_too(event):
    with pytest.raises(DatabaseError), transaction.atomic():
        TicketEvent.objects.filter(id=event.id).update(actor="someone else")
    assert TicketEvent.objects.get(id=event.id).actor == ""


def test_events_can_still_be_appended(event):
    TicketEvent.objects.create(ticket_id=event.ticket_id, kind="note", at=event.at)
    assert TicketEvent.objects.filter(ticket_id=event.ticket_id).count() == 2
