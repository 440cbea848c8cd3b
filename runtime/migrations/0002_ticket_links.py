"""The runtime tables' references to tickets (see 0001)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('endpoints', '0001_initial'),
        ('runtime', '0001_initial'),
        ('tickets', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='contextentry',
            name='ticket',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.ticket'),
        ),
        migrations.AddField(
            model_name='turn',
            name='endpoint',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='turns', to='endpoints.endpoint'),
        ),
        migrations.AddField(
            model_name='turn',
            name='ticket',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='turns', to='tickets.ticket'),
        ),
        migrations.AddField(
            model_name='endpointlock',
            name='holder',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='runtime.turn'),
        ),
        migrations.AddField(
            model_name='contextentry',
            name='turn',
            field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='context_entry', to='runtime.turn'),
        ),
        migrations.AddField(
            model_name='workerslot',
            name='turn',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='runtime.turn'),
        ),
        migrations.AddField(
            model_name='workerslot',
            name='worker',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='slots', to='runtime.worker'),
        ),
        migrations.AddIndex(
            model_name='turn',
            index=models.Index(condition=models.Q(('state__in', ['running', 'interrupting'])), fields=['deadline_at'], name='turn_active_deadline_idx'),
        ),
        migrations.AddConstraint(
            model_name='turn',
            constraint=models.UniqueConstraint(fields=('endpoint', 'seq'), name='turn_seq_unique'),
        ),
        migrations.AddConstraint(
            model_name='turn',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['running', 'completed', 'failed', 'interrupting', 'stopped', 'uncertain', 'unresolved'])), name='turn_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='endpointlock',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('holder__isnull', True), ('token__isnull', True)), models.Q(('holder__isnull', False), ('token__isnull', False)), _connector='OR'), name='lock_holder_token_together'),
        ),
        migrations.AddIndex(
            model_name='contextentry',
            index=models.Index(fields=['endpoint', '-seq'], name='context_recent_idx'),
        ),
        migrations.AddConstraint(
            model_name='workerslot',
            constraint=models.UniqueConstraint(fields=('worker', 'pid'), name='worker_slot_unique_pid'),
        ),
    ]
