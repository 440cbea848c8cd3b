"""The overdue sweep's own partial index (bench/scale.py, finding 12): open
obligations not yet flagged. ticket_obligation_open_idx holds every open
obligation, flagged or not, and a result nobody pulls stays open, flagged,
for good: the sweep's idle pass read each of them (5,000 rows, 7.1 ms at a
million tickets, 3.9x its time at ten thousand). This index holds only
what the sweep may still flag; the open one stays for the console's
obligation list (ordered by due time) and the metrics' count.

Built CONCURRENTLY on PostgreSQL (non-atomic migration; config.concurrent_index)."""

from django.db import migrations, models

from config import concurrent_index

NAME = "ticket_obligation_due_idx"


def forward(apps, schema_editor):
    concurrent_index.create(
        schema_editor,
        NAME,
        "tickets_ticket (obligation_due_at) "
        "WHERE obligation_state = 'open' AND NOT obligation_overdue",
    )


def backward(apps, schema_editor):
    concurrent_index.drop(schema_editor, NAME)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0012_smaller_ticket_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="ticket",
                    index=models.Index(
                        condition=models.Q(
                            ("obligation_overdue", False), ("obligation_state", "open")
                        ),
                        fields=["obligation_due_at"],
                        name=NAME,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
