# The search indexes of a ticket's input and result hold settled tickets
# only (bench/admission_variants.py --counts: without the two GIN entries an
# admission writes about a fifth less WAL, and a turn's start writes none
# either). The tickets still in flight are checked row by row
# (tickets/search.py), so a queued ticket is found by its text at once.
#
# Built and dropped CONCURRENTLY, as 0003 did: no lock that stops
# admissions while a large ledger's index is built; each statement its own
# (the migration is not atomic), IF [NOT] EXISTS so that a rerun after an
# interruption finishes the job. The previous release's searches name no
# state: they still run, past their newest tickets without these indexes.

import django.contrib.postgres.indexes
from django.db import migrations, models

SETTLED = "state IN ('cancelled', 'failed', 'orphaned', 'succeeded')"
SCOPED = "claimcheck_search_document(submitted_by_id, endpoint_id, input, result) jsonb_path_ops"

# name -> (the index as it was, the index as it is)
INDEXES = {
    "ticket_input_search_idx": (
        "(input jsonb_path_ops)",
        f"(input jsonb_path_ops) WHERE {SETTLED}",
    ),
    "ticket_result_search_idx": (
        "(result jsonb_path_ops) WHERE result IS NOT NULL",
        f"(result jsonb_path_ops) WHERE result IS NOT NULL AND {SETTLED}",
    ),
    "ticket_search_scoped_idx": (f"({SCOPED})", f"({SCOPED}) WHERE {SETTLED}"),
}


def _swap(name: str, was: str, now: str) -> list[migrations.RunSQL]:
    """Build ``now`` beside ``name``, drop ``name``, give the new one its
    name; each reversed by the step that undoes it (run in reverse order)."""
    create = "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON tickets_ticket USING gin {}"
    return [
        migrations.RunSQL(
            create.format(f"{name}_next", now), f"DROP INDEX CONCURRENTLY IF EXISTS {name}_next"
        ),
        migrations.RunSQL(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", create.format(name, was)),
        migrations.RunSQL(
            f"ALTER INDEX {name}_next RENAME TO {name}",
            f"ALTER INDEX {name} RENAME TO {name}_next",
        ),
    ]


DATABASE = [step for name, (was, now) in INDEXES.items() for step in _swap(name, was, now)]

STATE = [
    migrations.RemoveIndex(model_name="ticket", name="ticket_input_search_idx"),
    migrations.RemoveIndex(model_name="ticket", name="ticket_result_search_idx"),
    migrations.AddIndex(
        model_name="ticket",
        index=django.contrib.postgres.indexes.GinIndex(
            condition=models.Q(("state__in", ["cancelled", "failed", "orphaned", "succeeded"])),
            fields=["input"],
            name="ticket_input_search_idx",
            opclasses=["jsonb_path_ops"],
        ),
    ),
    migrations.AddIndex(
        model_name="ticket",
        index=django.contrib.postgres.indexes.GinIndex(
            condition=models.Q(
                ("result__isnull", False),
                ("state__in", ["cancelled", "failed", "orphaned", "succeeded"]),
            ),
            fields=["result"],
            name="ticket_result_search_idx",
            opclasses=["jsonb_path_ops"],
        ),
    ),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0007_ledger_owns_turns"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(database_operations=DATABASE, state_operations=STATE),
    ]
