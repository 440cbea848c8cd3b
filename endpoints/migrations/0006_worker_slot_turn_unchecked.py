"""The worker slot's turn: no foreign key and no index (issue 12). A pool
process's slot is rewritten at every start and finish; the check and the index
entry were work on every turn for a table of one row per pool process."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('endpoints', '0005_drop_indexes_a_composite_leads_with'),
    ]

    operations = [
        migrations.AlterField(
            model_name='workerslot',
            name='turn',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='endpoints.turn'),
        ),
    ]
