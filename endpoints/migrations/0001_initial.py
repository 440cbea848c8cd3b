"""The endpoint tables, without their references to tickets (0002).
Endpoint events are append-only (core/append_only.py)."""

import tickets.ids
from django.db import migrations, models

from core.append_only import AppendOnly


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='ContextEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField()),
                ('input', models.JSONField(null=True)),
                ('result', models.JSONField(null=True)),
                ('artifacts', models.JSONField(default=list)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['endpoint_id', 'seq'],
            },
        ),
        migrations.CreateModel(
            name='Endpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('address', models.SlugField(max_length=200, unique=True)),
                ('runner', models.JSONField(default=dict)),
                ('turn_budget_s', models.FloatField(default=300.0)),
                ('interrupt_grace_s', models.FloatField(default=10.0)),
                ('heartbeat_timeout_s', models.FloatField(default=30.0)),
                ('requires_approval', models.BooleanField(default=False)),
                ('busy_policy', models.CharField(choices=[('enqueue', 'Enqueue'), ('reject', 'Reject')], default='enqueue', max_length=16)),
                ('state', models.CharField(choices=[('available', 'Available'), ('quarantined', 'Quarantined')], default='available', max_length=16)),
                ('turn_seq', models.BigIntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['address'],
            },
        ),
        migrations.CreateModel(
            name='EndpointAlias',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('alias', models.SlugField(max_length=200, unique=True)),
            ],
            options={
                'ordering': ['alias'],
            },
        ),
        migrations.CreateModel(
            name='EndpointEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
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
            name='Turn',
            fields=[
                ('id', models.UUIDField(default=tickets.ids.new_id, editable=False, primary_key=True, serialize=False)),
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
            ],
        ),
        migrations.CreateModel(
            name='WorkerSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pid', models.IntegerField()),
                ('since', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
            ],
        ),
        AppendOnly("endpoints_endpointevent"),
    ]
