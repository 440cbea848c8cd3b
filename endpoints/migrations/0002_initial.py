"""The endpoint tables' references to tickets (a second migration: tickets
reference endpoints and turns, so the two apps' tables are created in
three steps, endpoints, tickets, then these). The turn's functions are in
endpoints/sql/, installed after every migrate (core/sqlfunctions.py)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models






class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('endpoints', '0001_initial'),
        ('tickets', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='contextentry',
            name='ticket',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.ticket'),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='owners',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='auth.group'),
        ),
        # The columns added after the references stay after them, so a fresh
        # database's tables have the same column order as every database
        # migrated before.
        migrations.AddField(
            model_name='endpoint',
            name='submit_restricted',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='submitter_groups',
            field=models.ManyToManyField(blank=True, related_name='+', to='auth.group'),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='submitter_users',
            field=models.ManyToManyField(blank=True, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='contextentry',
            name='endpoint',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='history', to='endpoints.endpoint'),
        ),
        migrations.AddField(
            model_name='endpointalias',
            name='endpoint',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='aliases', to='endpoints.endpoint'),
        ),
        migrations.AddField(
            model_name='endpointevent',
            name='endpoint',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='events', to='endpoints.endpoint'),
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
            model_name='turn',
            name='token_sha256',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.AddField(
            model_name='contextentry',
            name='turn',
            field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='context_entry', to='endpoints.turn'),
        ),
        migrations.AddField(
            model_name='workerslot',
            name='turn',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='endpoints.turn'),
        ),
        migrations.AddField(
            model_name='workerslot',
            name='worker',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='slots', to='endpoints.worker'),
        ),
        migrations.CreateModel(
            name='EndpointLock',
            fields=[
                ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='lock', serialize=False, to='endpoints.endpoint')),
                ('token', models.BigIntegerField(blank=True, null=True)),
                ('acquired_at', models.DateTimeField(blank=True, null=True)),
                ('holder', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.turn')),
            ],
        ),
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['available', 'quarantined'])), name='endpoint_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(('busy_policy__in', ['enqueue', 'reject'])), name='endpoint_busy_policy_valid'),
        ),
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(('turn_budget_s__gt', 0), ('interrupt_grace_s__gt', 0), ('heartbeat_timeout_s__gt', 0)), name='endpoint_budgets_positive'),
        ),
        migrations.AddIndex(
            model_name='endpointevent',
            index=models.Index(fields=['endpoint', 'id'], name='endpoint_event_idx'),
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
        migrations.AddIndex(
            model_name='contextentry',
            index=models.Index(fields=['endpoint', '-seq'], name='context_recent_idx'),
        ),
        migrations.AddConstraint(
            model_name='workerslot',
            constraint=models.UniqueConstraint(fields=('worker', 'pid'), name='worker_slot_unique_pid'),
        ),
        migrations.AddConstraint(
            model_name='endpointlock',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('holder__isnull', True), ('token__isnull', True)), models.Q(('holder__isnull', False), ('token__isnull', False)), _connector='OR'), name='lock_holder_token_together'),
        ),
    ]
