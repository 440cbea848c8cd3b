"""ticket_state_id_idx leaves out queued tickets too (issue 12, round 7).

Found by auto_explain: a turn's start takes its endpoint's oldest queued
ticket and its finish unmarks the next one. With statistics taken before a
backlog grew (between two ANALYZEs, in production as in the benchmark) the
generic plan a worker's prepared statement settles on found them through
this index, (state, id), walking every endpoint's queued tickets in id
order and filtering on the endpoint: one hot endpoint's backlog read again
by every other endpoint's every turn. Queued tickets are
ticket_queued_idx's, (endpoint, id) where queued, which every queued
lookup names its endpoint for; a page of queued tickets across endpoints
(the API's and console's state filter) reads that index or walks the
primary key newest first. One index entry less per admission, too.

Built and swapped CONCURRENTLY on PostgreSQL (no lock on the ledger's
writes; hence a non-atomic migration); SQLite does it plainly."""

from django.db import migrations, models

from config import concurrent_index

STATE = "ticket_state_id_idx"


def _swap(schema_editor, predicate: str) -> None:
    concurrent_index.rebuild(schema_editor, STATE, f"tickets_ticket (state, id DESC) {predicate}")


def forward(apps, schema_editor):
    _swap(schema_editor, "WHERE NOT (state IN ('succeeded', 'queued'))")


def backward(apps, schema_editor):
    _swap(schema_editor, "WHERE NOT (state = 'succeeded')")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0013_ticket_obligation_due_idx"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="ticket", name=STATE),
                migrations.AddIndex(
                    model_name="ticket",
                    index=models.Index(
                        condition=models.Q(("state__in", ["succeeded", "queued"]), _negated=True),
                        fields=["state", "-id"],
                        name=STATE,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
