"""A worker slot's link to its worker and to the turn it runs (a table of
the ledger's, tickets/migrations/0001_initial.py). Until the ledger took
them over, the turn, lock and context tables' references were added here
too; they are now in the ledger's 0001, under the same names."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('runtime', '0001_initial'),
        ('tickets', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerslot',
            name='turn',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tickets.turn'),
        ),
        migrations.AddField(
            model_name='workerslot',
            name='worker',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='slots', to='runtime.worker'),
        ),
        migrations.AddConstraint(
            model_name='workerslot',
            constraint=models.UniqueConstraint(fields=('worker', 'pid'), name='worker_slot_unique_pid'),
        ),
    ]
