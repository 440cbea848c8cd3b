# RetentionHold: the tickets an app above the ledger still points at (a
# recovery case, a re-run decision), recorded in the ledger, so that the
# prune reads only the ledger's tables (recovery makes and keeps its holds:
# recovery/sql/claimcheck_recovery_hold.sql, installed after this migrate,
# which also holds what the cases and decisions made before point at).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tickets", "0009_turn_slot"),
    ]

    operations = [
        migrations.CreateModel(
            name="RetentionHold",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("held_by", models.CharField(max_length=200)),
                ("since", models.DateTimeField()),
                (
                    "ticket",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tickets.ticket",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("ticket", "held_by"), name="retention_hold_unique"
                    )
                ],
            },
        ),
    ]
