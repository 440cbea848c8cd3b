"""Fewer bytes and fewer checks per ticket (issue 12: bytes per ticket).

- Events by ticket: event_ticket_idx (ticket_id, id) held one 40-byte entry
  per event, five events per ticket (200 B a ticket at 50,000 tickets). A
  ticket's events share its id, so a single-column index on ticket_id keeps
  them as one deduplicated posting list (about 60 B a ticket); the handful of
  events a ticket has are sorted by id after the lookup. It serves the same
  lookups and the foreign-key checks.
- Events' turn: only informational (the event is written by the statement
  that holds the turn), never looked up by turn. Its foreign key cost a check
  on every turn event and an index of mostly NULLs (107 B a ticket) that a
  turn's DELETE (retention) needed only to check that very key. Both go.
- The ticket's rarely-set references (parent, re-run of, return endpoint,
  completing turn, approver): their indexes hold a NULL entry for nearly
  every ticket; partial indexes (``WHERE … IS NOT NULL``) hold only the rows
  that have one, and still serve every lookup and foreign-key check by value.

Indexes are built and dropped CONCURRENTLY (no lock on the ledger's writes;
hence a non-atomic migration)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from config import concurrent_index

# The ticket's nullable references: column -> (Django's index, the partial one).
PARTIAL = {
    "parent_id": ("tickets_ticket_parent_id_09dd967f", "ticket_parent_idx"),
    "rerun_of_id": ("tickets_ticket_rerun_of_id_2858c1ac", "ticket_rerun_of_idx"),
    "return_to_id": ("tickets_ticket_return_to_id_7f4e0133", "ticket_return_to_idx"),
    "completed_by_turn_id": (
        "tickets_ticket_completed_by_turn_id_96739901",
        "ticket_completed_by_turn_idx",
    ),
    "approved_by_id": ("tickets_ticket_approved_by_id_6c259d96", "ticket_approved_by_idx"),
}
EVENT_TICKET = "tickets_ticketevent_ticket_id_b572d14b"
EVENT_TURN = "tickets_ticketevent_turn_id_9363fa4e"


def _event_turn_fk(schema_editor) -> list[str]:
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'tickets_ticketevent'::regclass "
            "AND contype = 'f' AND conkey = ARRAY[(SELECT attnum FROM pg_attribute "
            "WHERE attrelid = 'tickets_ticketevent'::regclass AND attname = 'turn_id')]::int2[]"
        )
        return [row[0] for row in cur.fetchall()]


def forward(apps, schema_editor):
    create, drop = concurrent_index.create, concurrent_index.drop
    create(schema_editor, EVENT_TICKET, "tickets_ticketevent (ticket_id)")
    drop(schema_editor, "event_ticket_idx")
    for name in _event_turn_fk(schema_editor):
        schema_editor.execute(f"ALTER TABLE tickets_ticketevent DROP CONSTRAINT {name}")
    drop(schema_editor, EVENT_TURN)
    for column, (old, new) in PARTIAL.items():
        create(schema_editor, new, f"tickets_ticket ({column}) WHERE {column} IS NOT NULL")
        drop(schema_editor, old)


def backward(apps, schema_editor):
    create, drop = concurrent_index.create, concurrent_index.drop
    for column, (old, new) in PARTIAL.items():
        create(schema_editor, old, f"tickets_ticket ({column})")
        drop(schema_editor, new)
    create(schema_editor, EVENT_TURN, "tickets_ticketevent (turn_id)")
    if not _event_turn_fk(schema_editor):
        schema_editor.execute(
            "ALTER TABLE tickets_ticketevent ADD CONSTRAINT "
            "tickets_ticketevent_turn_id_9363fa4e_fk_endpoints_turn_id FOREIGN KEY (turn_id) "
            "REFERENCES endpoints_turn (id) DEFERRABLE INITIALLY DEFERRED"
        )
    create(schema_editor, "event_ticket_idx", "tickets_ticketevent (ticket_id, id)")
    drop(schema_editor, EVENT_TICKET)


def _nullable_fk(to: str, on_delete, related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        blank=True,
        db_index=False,
        null=True,
        on_delete=on_delete,
        related_name=related_name,
        to=to,
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("endpoints", "0005_drop_indexes_a_composite_leads_with"),
        ("tickets", "0010_ticket_callback_pending_idx"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="ticketevent", name="event_ticket_idx"),
                migrations.AlterField(
                    model_name="ticketevent",
                    name="ticket",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="tickets.ticket",
                    ),
                ),
                migrations.AlterField(
                    model_name="ticketevent",
                    name="turn",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="endpoints.turn",
                    ),
                ),
                migrations.AlterField(
                    model_name="ticket",
                    name="parent",
                    field=_nullable_fk(
                        "tickets.ticket", django.db.models.deletion.PROTECT, "children"
                    ),
                ),
                migrations.AlterField(
                    model_name="ticket",
                    name="rerun_of",
                    field=_nullable_fk("tickets.ticket", django.db.models.deletion.PROTECT, "reruns"),
                ),
                migrations.AlterField(
                    model_name="ticket",
                    name="return_to",
                    field=_nullable_fk("endpoints.endpoint", django.db.models.deletion.PROTECT, "+"),
                ),
                migrations.AlterField(
                    model_name="ticket",
                    name="completed_by_turn",
                    field=_nullable_fk("endpoints.turn", django.db.models.deletion.PROTECT, "+"),
                ),
                migrations.AlterField(
                    model_name="ticket",
                    name="approved_by",
                    field=_nullable_fk(
                        settings.AUTH_USER_MODEL, django.db.models.deletion.SET_NULL, "+"
                    ),
                ),
                *[
                    migrations.AddIndex(
                        model_name="ticket",
                        index=models.Index(
                            condition=models.Q((f"{column[:-3]}__isnull", False)),
                            fields=[column[:-3]],
                            name=new,
                        ),
                    )
                    for column, (_, new) in PARTIAL.items()
                ],
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
