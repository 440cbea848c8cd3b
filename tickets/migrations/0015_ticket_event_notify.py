"""Every ticket event wakes the ticket's watchers (issue 12: waits without
polling, the console's live regions included).

A statement trigger on tickets_ticketevent calls ``pg_notify`` on
``claimcheck_ticket`` with each ticket id the statement wrote an event for;
PostgreSQL delivers it when the transaction commits, folds repeats of one id
within a transaction into one, and drops it on rollback. Every path that
records an event (the ORM, the admission and turn statements, a bulk SQL
load) is covered without one more round trip. A statement that writes
events for more than 64 tickets (a bulk load) notifies ``*`` once: every
watcher re-reads, rather than a million notifications in the queue.

Before this, only a terminal transition notified (tickets/lifecycle.py and
the turn's finish statement), which was enough for ``wait_s`` but not for a
console page that shows a ticket's every step.

SQLite (``make run``) has no notifications: the console polls there."""

from django.db import migrations

CHANNEL = "claimcheck_ticket"
BULK = 64

FUNCTION = f"""
CREATE OR REPLACE FUNCTION claimcheck_ticket_event_notify() RETURNS trigger AS $$
BEGIN
    IF (SELECT pg_catalog.count(DISTINCT ticket_id) FROM new_events) > {BULK} THEN
        PERFORM pg_catalog.pg_notify('{CHANNEL}', '*');
    ELSE
        PERFORM pg_catalog.pg_notify('{CHANNEL}', c.ticket_id::text)
        FROM (SELECT DISTINCT ticket_id FROM new_events) c;
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

TRIGGER = """
CREATE TRIGGER tickets_ticketevent_notify
AFTER INSERT ON tickets_ticketevent REFERENCING NEW TABLE AS new_events
FOR EACH STATEMENT EXECUTE FUNCTION claimcheck_ticket_event_notify();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION, params=None)
    schema_editor.execute("DROP TRIGGER IF EXISTS tickets_ticketevent_notify ON tickets_ticketevent;")
    schema_editor.execute(TRIGGER, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS tickets_ticketevent_notify ON tickets_ticketevent;")
    schema_editor.execute("DROP FUNCTION IF EXISTS claimcheck_ticket_event_notify();")


class Migration(migrations.Migration):
    dependencies = [("tickets", "0014_state_index_without_queued")]

    operations = [migrations.RunPython(forward, backward)]
