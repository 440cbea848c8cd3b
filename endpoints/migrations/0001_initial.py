"""The endpoint directory's tables. Endpoint events, generations, change
proposals and their reviews, and route generations are append-only evidence
(core/append_only.py)."""

import core.ids
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.append_only import AppendOnly


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
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
                ('quarantine_case', models.UUIDField(blank=True, null=True)),
                ('turn_seq', models.BigIntegerField(default=0)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('pause_actor', models.CharField(blank=True, db_default='', default='', max_length=200)),
                ('pause_reason', models.TextField(blank=True, db_default='', default='')),
                ('submit_restricted', models.BooleanField(db_default=False, default=False)),
                ('generation', models.PositiveIntegerField(db_default=1, default=1)),
                ('notes', models.TextField(blank=True, db_default='', default='')),
                ('change_requires_second_person', models.BooleanField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('owners', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='auth.group')),
                ('submitter_groups', models.ManyToManyField(blank=True, related_name='+', to='auth.group')),
                ('submitter_users', models.ManyToManyField(blank=True, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['address'],
            },
        ),
        migrations.CreateModel(
            name='ChangeProposal',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('base_generation', models.PositiveIntegerField()),
                ('changes', models.JSONField()),
                ('diff', models.JSONField()),
                ('reason', models.TextField()),
                ('origin', models.JSONField(blank=True, default=dict)),
                ('restores', models.PositiveIntegerField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('proposer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.DO_NOTHING, related_name='proposals', to='endpoints.endpoint')),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='EndpointAlias',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('alias', models.SlugField(max_length=200, unique=True)),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='aliases', to='endpoints.endpoint')),
            ],
            options={
                'verbose_name_plural': 'endpoint aliases',
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
                ('endpoint', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='events', to='endpoints.endpoint')),
            ],
            options={
                'ordering': ['id'],
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
            },
        ),
        migrations.CreateModel(
            name='ChangeReview',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
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
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(('quarantine_case__isnull', True), ('state', 'quarantined'), _connector='OR'), name='endpoint_case_when_quarantined'),
        ),
        migrations.AddConstraint(
            model_name='endpoint',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('paused_at__isnull', True), ('pause_reason', ''), ('pause_actor', '')), models.Q(('paused_at__isnull', False), models.Q(('pause_reason', ''), _negated=True)), _connector='OR'), name='endpoint_pause_explained'),
        ),
        migrations.AddIndex(
            model_name='endpointevent',
            index=models.Index(fields=['endpoint', 'id'], name='endpoint_event_idx'),
        ),
        migrations.AddConstraint(
            model_name='endpointgeneration',
            constraint=models.UniqueConstraint(fields=('endpoint', 'number'), name='generation_number_unique'),
        ),
        migrations.AddConstraint(
            model_name='endpointgeneration',
            constraint=models.CheckConstraint(condition=models.Q(('number__gte', 1)), name='generation_number_positive'),
        ),
        migrations.AddConstraint(
            model_name='routegeneration',
            constraint=models.UniqueConstraint(fields=('alias', 'number'), name='route_generation_unique'),
        ),
        AppendOnly(
            "endpoints_endpointevent",
            "endpoints_endpointgeneration",
            "endpoints_changeproposal",
            "endpoints_changereview",
            "endpoints_routegeneration",
        ),
    ]
