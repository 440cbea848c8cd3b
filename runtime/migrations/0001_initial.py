"""The runtime's tables, without their references to tickets (0002: tickets
reference turns and turns reference tickets, so the two apps' tables are
created in three steps, runtime, tickets, then 0002).

- Every endpoint has its lock row from its creation on: turns lock it,
  never create it. The endpoint directory below (endpoints.services) does
  not know the lock, so a trigger on the endpoint table inserts it.
- Worker events are append-only (core/append_only.py).

The turn's functions are in runtime/sql/, installed after every migrate
(core/sqlfunctions.py)."""

import core.ids
import django.db.models.deletion
from django.db import migrations, models

from core.append_only import AppendOnly


LOCK_ROW_SQL = """
CREATE FUNCTION claimcheck_endpoint_lock_row() RETURNS trigger AS $$
BEGIN
    INSERT INTO runtime_endpointlock (endpoint_id) VALUES (NEW.id);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER endpoint_lock_row AFTER INSERT ON endpoints_endpoint
    FOR EACH ROW EXECUTE FUNCTION claimcheck_endpoint_lock_row();
"""

DROP_LOCK_ROW_SQL = """
DROP TRIGGER endpoint_lock_row ON endpoints_endpoint;
DROP FUNCTION claimcheck_endpoint_lock_row();
"""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('endpoints', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='EndpointLock',
            fields=[
                ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='lock', serialize=False, to='endpoints.endpoint')),
                ('token', models.BigIntegerField(blank=True, null=True)),
                ('acquired_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='Turn',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('seq', models.BigIntegerField()),
                ('state', models.CharField(choices=[('running', 'Running'), ('completed', 'Completed'), ('failed', 'Failed'), ('interrupting', 'Interrupting'), ('stopped', 'Stopped'), ('uncertain', 'Uncertain'), ('unresolved', 'Unresolved')], default='running', max_length=16)),
                ('runner_kind', models.CharField(choices=[('python', 'Python'), ('command', 'Command'), ('http', 'Http'), ('agent', 'Agent')], max_length=16)),
                ('celery_task_id', models.CharField(blank=True, default='', max_length=255)),
                ('worker', models.JSONField(blank=True, default=dict)),
                ('started_at', models.DateTimeField()),
                ('heartbeat_at', models.DateTimeField()),
                ('deadline_at', models.DateTimeField()),
                ('interrupt_requested_at', models.DateTimeField(blank=True, null=True)),
                ('interrupt_reason', models.CharField(blank=True, default='', max_length=32)),
                ('ended_at', models.DateTimeField(blank=True, null=True)),
                ('stop_evidence', models.JSONField(blank=True, null=True)),
                ('token_sha256', models.CharField(blank=True, db_default='', default='', max_length=64)),
                ('generation', models.PositiveIntegerField(db_default=1, default=1)),
            ],
            options={
                'ordering': ['endpoint_id', 'seq'],
            },
        ),
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255, unique=True)),
                ('host', models.CharField(max_length=255)),
                ('pid', models.IntegerField()),
                ('queues', models.JSONField(default=list)),
                ('pool_size', models.IntegerField(default=0)),
                ('started_at', models.DateTimeField()),
                ('last_seen_at', models.DateTimeField()),
                ('consuming', models.JSONField(default=list)),
            ],
        ),
        migrations.CreateModel(
            name='WorkerEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('worker', models.CharField(db_index=True, max_length=255)),
                ('kind', models.CharField(max_length=64)),
                ('actor', models.CharField(blank=True, default='', max_length=200)),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('at', models.DateTimeField()),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='WorkerSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pid', models.IntegerField()),
                ('since', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
                ('child_pid', models.IntegerField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='ContextEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField()),
                ('input', models.JSONField(null=True)),
                ('result', models.JSONField(null=True)),
                ('artifacts', models.JSONField(default=list)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('endpoint', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='history', to='endpoints.endpoint')),
            ],
            options={
                'verbose_name_plural': 'context entries',
                'ordering': ['endpoint_id', 'seq'],
            },
        ),
        migrations.RunSQL(LOCK_ROW_SQL, DROP_LOCK_ROW_SQL),
        AppendOnly("runtime_workerevent"),
    ]
