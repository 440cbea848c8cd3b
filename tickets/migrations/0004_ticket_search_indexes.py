"""GIN indexes (jsonb_path_ops) of the ticket's input and result, for the
search by key and value (tickets.search): ``input @> '{"customer": 42}'``.

Built ``CONCURRENTLY`` (no lock on admissions while a large ledger's index
builds; hence a non-atomic migration). An interrupted build leaves an
``INVALID`` index of that name: drop it before running the migration again
(docs/deploy.md)."""

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations
from django.db.models import Q


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0003_plural_labels"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="ticket",
            index=GinIndex(
                fields=["input"], opclasses=["jsonb_path_ops"], name="ticket_input_search_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="ticket",
            index=GinIndex(
                fields=["result"],
                opclasses=["jsonb_path_ops"],
                name="ticket_result_search_idx",
                condition=Q(result__isnull=False),
            ),
        ),
    ]
