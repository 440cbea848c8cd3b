"""The runtime's tables: workers, their events and their pool processes
(0002 links a slot to the turn it runs, a table of the ledger's).

- Worker events are append-only (core/append_only.py).

Until the ledger took them over, this migration also created the turn,
lock and context tables (now tickets/migrations/0001_initial.py, under the
same table names): a database migrated before that has them from here, a
fresh one from there, and the two are the same
(tests/config/test_schema_upgrade.py)."""

from django.db import migrations, models

from core.append_only import AppendOnly


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
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
        AppendOnly("runtime_workerevent"),
    ]
