"""Drop the single-column indexes of Turn.endpoint, ContextEntry.endpoint,
EndpointEvent.endpoint and WorkerSlot.worker: turn_seq_unique (endpoint_id,
seq), context_recent_idx (endpoint_id, seq DESC), endpoint_event_idx and
worker_slot_unique_pid (worker_id, pid) lead with the same column and serve
every lookup and foreign-key check they served. Each cost an index entry per
row written (issue 12: fewer writes per turn, fewer bytes per ticket;
tests/test_house_rules.py keeps it so).

The database operation is a plain DROP INDEX (the names Django gave them are
the same on PostgreSQL and SQLite): an AlterField would make SQLite rebuild
the table."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0004_worker_registry"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="contextentry",
                    name="endpoint",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="history",
                        to="endpoints.endpoint",
                    ),
                ),
                migrations.AlterField(
                    model_name="turn",
                    name="endpoint",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="turns",
                        to="endpoints.endpoint",
                    ),
                ),
                migrations.AlterField(
                    model_name="endpointevent",
                    name="endpoint",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="endpoints.endpoint",
                    ),
                ),
                migrations.AlterField(
                    model_name="workerslot",
                    name="worker",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="slots",
                        to="endpoints.worker",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS endpoints_contextentry_endpoint_id_59d67df8",
                    "CREATE INDEX endpoints_contextentry_endpoint_id_59d67df8"
                    " ON endpoints_contextentry (endpoint_id)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS endpoints_turn_endpoint_id_b5d05986",
                    "CREATE INDEX endpoints_turn_endpoint_id_b5d05986 ON endpoints_turn (endpoint_id)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS endpoints_endpointevent_endpoint_id_ec9d165e",
                    "CREATE INDEX endpoints_endpointevent_endpoint_id_ec9d165e"
                    " ON endpoints_endpointevent (endpoint_id)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS endpoints_workerslot_worker_id_accb707c",
                    "CREATE INDEX endpoints_workerslot_worker_id_accb707c"
                    " ON endpoints_workerslot (worker_id)",
                ),
            ],
        ),
    ]
