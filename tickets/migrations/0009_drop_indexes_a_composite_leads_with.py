"""Drop the single-column indexes of TicketEvent.ticket and
DeliveryAttempt.delivery: event_ticket_idx (ticket_id, id) and
attempt_number_unique (delivery_id, number) lead with the same column and
serve every lookup and foreign-key check they served. The first cost an index
entry per event, four events per ticket (issue 12: fewer writes per ticket,
fewer bytes per ticket; tests/test_house_rules.py keeps it so).

The database operation is a plain DROP INDEX (the names Django gave them are the
same on PostgreSQL and SQLite): an AlterField would make SQLite rebuild the
tables and lose their append-only triggers."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tickets", "0008_prune_ledger"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="ticketevent",
                    name="ticket",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="tickets.ticket",
                    ),
                ),
                migrations.AlterField(
                    model_name="deliveryattempt",
                    name="delivery",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempt_log",
                        to="tickets.delivery",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS tickets_ticketevent_ticket_id_b572d14b",
                    "CREATE INDEX tickets_ticketevent_ticket_id_b572d14b"
                    " ON tickets_ticketevent (ticket_id)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS tickets_deliveryattempt_delivery_id_547479ba",
                    "CREATE INDEX tickets_deliveryattempt_delivery_id_547479ba"
                    " ON tickets_deliveryattempt (delivery_id)",
                ),
            ],
        ),
    ]
