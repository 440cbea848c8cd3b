"""Smaller ticket and event indexes (issue 12: bytes per ticket).

- ticket_state_id_idx (state, id DESC) leaves out the succeeded tickets.
  Nearly every ticket of a ledger ends succeeded, and the index held an
  entry for each (88 B a ticket at 50,000 tickets); the states an operator
  filters for (queued, running, waiting, failed, cancelled, orphaned) stay
  in it. A page of succeeded tickets walks the primary key newest first,
  where nearly every row matches, as the console's delivery filter already
  does for "delivered" (console 0002).
- ticket_trace_idx holds trace_id alone: a trace has at most
  TRACE_HARD_LIMIT tickets (200 by default), sorted by id after the lookup,
  and the id made every entry 16 bytes longer.
- The events' primary key and ticket index fill their pages (fillfactor
  100): events are never updated, so the room PostgreSQL leaves by default
  for updates is never used. It applies to pages split from now on.

Built and swapped CONCURRENTLY (no lock on the ledger's writes; hence a
non-atomic migration)."""

from django.db import migrations, models

from config import concurrent_index

STATE = "ticket_state_id_idx"
TRACE = "ticket_trace_idx"
EVENT_INDEXES = ("tickets_ticketevent_pkey", "tickets_ticketevent_ticket_id_b572d14b")


def _swap(schema_editor, name: str, spec: str) -> None:
    concurrent_index.rebuild(schema_editor, name, f"tickets_ticket {spec}")


def _fillfactor(schema_editor, value: int) -> None:
    for name in EVENT_INDEXES:
        schema_editor.execute(f"ALTER INDEX {name} SET (fillfactor = {value})")


def forward(apps, schema_editor):
    _swap(schema_editor, STATE, "(state, id DESC) WHERE NOT (state = 'succeeded')")
    _swap(schema_editor, TRACE, "(trace_id)")
    _fillfactor(schema_editor, 100)


def backward(apps, schema_editor):
    _fillfactor(schema_editor, 90)
    _swap(schema_editor, TRACE, "(trace_id, id)")
    _swap(schema_editor, STATE, "(state, id DESC)")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0011_smaller_ledger_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="ticket", name=STATE),
                migrations.AddIndex(
                    model_name="ticket",
                    index=models.Index(
                        condition=models.Q(("state", "succeeded"), _negated=True),
                        fields=["state", "-id"],
                        name=STATE,
                    ),
                ),
                migrations.RemoveIndex(model_name="ticket", name=TRACE),
                migrations.AddIndex(
                    model_name="ticket",
                    index=models.Index(fields=["trace_id"], name=TRACE),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
