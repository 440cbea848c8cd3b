# Fewer index entries per ticket version (bench/costs.py --by-relation).
#
# A ticket is written three times or more (admitted, started, finished, its
# delivery), and none of those updates is HOT: each version enters every
# index whose predicate it meets. Four of those entries said nothing:
#
# - turn_id: a queued ticket's NULL (ticket_turn_idx holds set ones only);
# - callback_for_id: a one-to-one field's unique index held a NULL for every
#   ticket that is not a callback, in every version (the partial unique
#   constraint ticket_callback_for_unique holds callbacks only);
# - submitted_by_id: a NULL for every ticket the runtime admitted (a child, a
#   callback, a re-run), in every version;
# - the trace's id: Django's ``varchar_pattern_ops`` twin of a character
#   primary key, for LIKE lookups nothing makes (one entry per root ticket).
#
# A lookup by value (``turn_id = %s``, a foreign key's check on delete)
# implies NOT NULL, so a partial index serves it.
#
# The indexes are built and dropped CONCURRENTLY (no lock that stops
# admissions while a large ledger's index is built): the migration is not
# atomic, each statement its own, and IF [NOT] EXISTS makes a rerun after an
# interruption finish the job. The foreign keys stay as they are (Django's
# own operations would drop and re-validate them across the whole table).

import django.db.models.deletion
from django.db import migrations, models


def run(sql: str, reverse: str) -> migrations.RunSQL:
    return migrations.RunSQL(sql, reverse_sql=reverse)


DATABASE = [
    run(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ticket_turn_idx ON tickets_ticket (turn_id) "
        "WHERE turn_id IS NOT NULL",
        "DROP INDEX CONCURRENTLY IF EXISTS ticket_turn_idx",
    ),
    run(
        "DROP INDEX CONCURRENTLY IF EXISTS tickets_ticket_turn_id_a5e60c04",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS tickets_ticket_turn_id_a5e60c04 "
        "ON tickets_ticket (turn_id)",
    ),
    run(
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS ticket_callback_for_unique "
        "ON tickets_ticket (callback_for_id) WHERE callback_for_id IS NOT NULL",
        "DROP INDEX CONCURRENTLY IF EXISTS ticket_callback_for_unique",
    ),
    run(
        "ALTER TABLE tickets_ticket DROP CONSTRAINT IF EXISTS tickets_ticket_callback_for_id_key",
        "ALTER TABLE tickets_ticket ADD CONSTRAINT tickets_ticket_callback_for_id_key "
        "UNIQUE (callback_for_id)",
    ),
    run(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ticket_submitter_id_partial "
        "ON tickets_ticket (submitted_by_id, id DESC) WHERE submitted_by_id IS NOT NULL",
        "DROP INDEX CONCURRENTLY IF EXISTS ticket_submitter_id_partial",
    ),
    run(
        "DROP INDEX CONCURRENTLY IF EXISTS ticket_submitter_id_idx",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ticket_submitter_id_idx "
        "ON tickets_ticket (submitted_by_id, id DESC)",
    ),
    run(
        "ALTER INDEX ticket_submitter_id_partial RENAME TO ticket_submitter_id_idx",
        "ALTER INDEX ticket_submitter_id_idx RENAME TO ticket_submitter_id_partial",
    ),
    run(
        "DROP INDEX CONCURRENTLY IF EXISTS tickets_trace_id_c1c311f7_like",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS tickets_trace_id_c1c311f7_like "
        "ON tickets_trace (id varchar_pattern_ops)",
    ),
]

STATE = [
    migrations.RemoveIndex(
        model_name="ticket",
        name="ticket_submitter_id_idx",
    ),
    migrations.AlterField(
        model_name="ticket",
        name="callback_for",
        field=models.ForeignKey(
            blank=True,
            db_index=False,
            null=True,
            on_delete=django.db.models.deletion.PROTECT,
            related_name="+",
            to="tickets.ticket",
        ),
    ),
    migrations.AlterField(
        model_name="ticket",
        name="turn",
        field=models.ForeignKey(
            blank=True,
            db_index=False,
            null=True,
            on_delete=django.db.models.deletion.PROTECT,
            related_name="+",
            to="tickets.turn",
        ),
    ),
    migrations.AddIndex(
        model_name="ticket",
        index=models.Index(
            condition=models.Q(("submitted_by__isnull", False)),
            fields=["submitted_by", "-id"],
            name="ticket_submitter_id_idx",
        ),
    ),
    migrations.AddIndex(
        model_name="ticket",
        index=models.Index(
            condition=models.Q(("turn__isnull", False)),
            fields=["turn"],
            name="ticket_turn_idx",
        ),
    ),
    migrations.AddConstraint(
        model_name="ticket",
        constraint=models.UniqueConstraint(
            condition=models.Q(("callback_for__isnull", False)),
            fields=("callback_for",),
            name="ticket_callback_for_unique",
        ),
    ),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0002_drop_ticket_version"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(database_operations=DATABASE, state_operations=STATE),
    ]
