"""Endpoint generations, change proposals and their reviews, route
generations: append-only evidence (core/append_only.py). Every existing
endpoint gets generation 1 (its configuration as it is), every existing
alias route generation 1; turns so far ran under generation 1."""

import django.db.models.deletion
import tickets.ids
from django.conf import settings
from django.db import migrations, models

from core.append_only import AppendOnly

BACKFILL = """
INSERT INTO endpoints_endpointgeneration (
    endpoint_id, number, config, changes, actor, reason, first_seq, at)
SELECT e.id, 1, jsonb_build_object(
    'runner', e.runner, 'turn_budget_s', e.turn_budget_s,
    'interrupt_grace_s', e.interrupt_grace_s, 'heartbeat_timeout_s', e.heartbeat_timeout_s,
    'busy_policy', e.busy_policy, 'requires_approval', e.requires_approval, 'notes', e.notes),
    '{}'::jsonb, 'migration', 'the configuration when generations began', 1, now()
FROM endpoints_endpoint e;
INSERT INTO endpoints_routegeneration (alias, number, endpoint_id, actor, reason, at)
SELECT a.alias, 1, a.endpoint_id, 'migration', 'the route when route generations began', now()
FROM endpoints_endpointalias a;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('endpoints', '0004_workerslot_child_pid'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='endpoint',
            name='change_requires_second_person',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='generation',
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name='endpoint',
            name='notes',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='turn',
            name='generation',
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.CreateModel(
            name='ChangeProposal',
            fields=[
                ('id', models.UUIDField(default=tickets.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('base_generation', models.PositiveIntegerField()),
                ('changes', models.JSONField()),
                ('diff', models.JSONField()),
                ('reason', models.TextField()),
                ('origin', models.JSONField(blank=True, default=dict)),
                ('restores', models.PositiveIntegerField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.DO_NOTHING, related_name='proposals', to='endpoints.endpoint')),
                ('proposer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='ChangeReview',
            fields=[
                ('id', models.UUIDField(default=tickets.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('verdict', models.CharField(choices=[('approved', 'Approved'), ('rejected', 'Rejected')], max_length=16)),
                ('reason', models.TextField()),
                ('generation', models.PositiveIntegerField(blank=True, null=True)),
                ('at', models.DateTimeField()),
                ('proposal', models.OneToOneField(on_delete=django.db.models.deletion.DO_NOTHING, related_name='review', to='endpoints.changeproposal')),
                ('reviewer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['at'],
                'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('verdict', 'approved'), ('generation__isnull', False)), models.Q(('verdict', 'rejected'), ('generation__isnull', True)), _connector='OR'), name='review_verdict_generation')],
            },
        ),
        migrations.CreateModel(
            name='EndpointGeneration',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('config', models.JSONField()),
                ('changes', models.JSONField(default=dict)),
                ('actor', models.CharField(blank=True, default='', max_length=200)),
                ('reason', models.TextField(blank=True, default='')),
                ('restores', models.PositiveIntegerField(blank=True, null=True)),
                ('first_seq', models.BigIntegerField(default=1)),
                ('at', models.DateTimeField()),
                ('endpoint', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='generations', to='endpoints.endpoint')),
                ('proposal', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='endpoints.changeproposal')),
            ],
            options={
                'ordering': ['endpoint_id', 'number'],
                'constraints': [models.UniqueConstraint(fields=('endpoint', 'number'), name='generation_number_unique'), models.CheckConstraint(condition=models.Q(('number__gte', 1)), name='generation_number_positive')],
            },
        ),
        migrations.CreateModel(
            name='RouteGeneration',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('alias', models.SlugField(db_index=False, max_length=200)),
                ('number', models.PositiveIntegerField()),
                ('actor', models.CharField(blank=True, default='', max_length=200)),
                ('reason', models.TextField(blank=True, default='')),
                ('at', models.DateTimeField()),
                ('endpoint', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='endpoints.endpoint')),
            ],
            options={
                'ordering': ['alias', 'number'],
                'constraints': [models.UniqueConstraint(fields=('alias', 'number'), name='route_generation_unique')],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        AppendOnly(
            "endpoints_endpointgeneration",
            "endpoints_changeproposal",
            "endpoints_changereview",
            "endpoints_routegeneration",
        ),
    ]
