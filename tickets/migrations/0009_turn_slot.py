# The ledger records which worker pool process runs a turn (Turn.slot, and
# Turn.released_at once that process let go of it), on the turn's own row
# in the start's and the finish's statements: the worker registry derives
# its slots' turns from them (runtime/selectors.py) instead of the start and
# finish writing the registry's table, a table of an app above the ledger.
#
# The new columns are nullable (no table rewrite, and the previous release's
# writes go on). The slot index is built CONCURRENTLY (no lock that stops
# turns from starting while a large ledger's index is built): the migration
# is not atomic, and IF NOT EXISTS makes a rerun after an interruption
# finish the job.

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0008_search_settled_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="slot",
            field=models.CharField(blank=True, max_length=300, null=True),
        ),
        migrations.AddField(
            model_name="turn",
            name="released_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS turn_slot_idx "
                    "ON runtime_turn (slot, started_at) WHERE slot IS NOT NULL",
                    "DROP INDEX CONCURRENTLY IF EXISTS turn_slot_idx",
                )
            ],
            state_operations=[
                migrations.AddIndex(
                    model_name="turn",
                    index=models.Index(
                        condition=models.Q(("slot__isnull", False)),
                        fields=["slot", "started_at"],
                        name="turn_slot_idx",
                    ),
                )
            ],
        ),
    ]
