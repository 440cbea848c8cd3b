"""A partial index for the pending-callback retry sweep
(``tickets.callbacks.retry_pending_callbacks``), which read the whole ticket
table on every pass: 326 ms at a million tickets against 10.8 ms at ten
thousand (bench/README.md, finding 11). It holds only the callbacks still
owed, so it costs nothing on the write path of an ordinary ticket.

Built CONCURRENTLY on PostgreSQL (no lock on the ticket table's writes
while it builds, hence a non-atomic migration); SQLite builds it plainly."""

from django.db import migrations, models

from config import concurrent_index

NAME = "ticket_callback_pending_idx"


def create(apps, schema_editor):
    concurrent_index.create(
        schema_editor, NAME, "tickets_ticket (id) WHERE callback_state = 'pending'"
    )


def drop(apps, schema_editor):
    concurrent_index.drop(schema_editor, NAME)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0009_drop_indexes_a_composite_leads_with"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="ticket",
                    index=models.Index(
                        condition=models.Q(("callback_state", "pending")),
                        fields=["id"],
                        name=NAME,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(create, drop)],
        ),
    ]
