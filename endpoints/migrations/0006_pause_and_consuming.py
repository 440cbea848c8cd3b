"""An owner's pause of an endpoint (beside its state), the queues a worker
consumes now, and the append-only record of who stopped or resumed a
worker's consuming (core/append_only.py)."""

from django.db import migrations, models

from core.append_only import AppendOnly


class Migration(migrations.Migration):

    dependencies = [
        ('endpoints', '0005_generations'),
    ]

    operations = [
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
        AppendOnly('endpoints_workerevent'),
        migrations.AddField(
            model_name='endpoint',
            name='pause_actor',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='pause_reason',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='worker',
            name='consuming',
            field=models.JSONField(default=list),
        ),
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('paused_at__isnull', True), ('pause_reason', ''), ('pause_actor', '')), models.Q(('paused_at__isnull', False), models.Q(('pause_reason', ''), _negated=True)), _connector='OR'), name='endpoint_pause_explained'),
        ),
    ]
