"""The recovery tables. Inspections, decisions, lessons and case evidence
are the audit record: append-only (core/append_only.py)."""

import core.ids
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from core.append_only import AppendOnly


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('endpoints', '0001_initial'),
        ('runtime', '0002_ticket_links'),
        ('tickets', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='RecoveryCase',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('reason', models.TextField()),
                ('state', models.CharField(choices=[('open', 'Open'), ('decided', 'Decided'), ('closed', 'Closed')], default='open', max_length=8)),
                ('opened_at', models.DateTimeField()),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('endpoint', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='recovery_cases', to='endpoints.endpoint')),
                ('ticket', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.ticket')),
                ('turn', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.turn')),
            ],
            options={
                'ordering': ['-opened_at'],
            },
        ),
        migrations.CreateModel(
            name='ProcessStop',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('rationale', models.TextField()),
                ('worker', models.CharField(max_length=255)),
                ('host', models.CharField(max_length=255)),
                ('pid', models.IntegerField()),
                ('outcome', models.CharField(default='requested', max_length=20)),
                ('exit', models.JSONField(default=dict)),
                ('created_at', models.DateTimeField()),
                ('done_at', models.DateTimeField(blank=True, null=True)),
                ('actor', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('case', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='process_stops', to='recovery.recoverycase')),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
        migrations.CreateModel(
            name='Lesson',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('what_failed', models.TextField()),
                ('evidence', models.TextField()),
                ('prevention', models.TextField()),
                ('created_at', models.DateTimeField()),
                ('actor', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('case', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='lesson', to='recovery.recoverycase')),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='Inspection',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('snapshot', models.JSONField()),
                ('sha256', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField()),
                ('actor', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('case', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='inspections', to='recovery.recoverycase')),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
        migrations.CreateModel(
            name='Decision',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('action', models.CharField(choices=[('finalize_orphan', 'Finalize Orphan'), ('authorize_rerun', 'Authorize Rerun'), ('keep_quarantined', 'Keep Quarantined'), ('release', 'Release')], max_length=20)),
                ('rationale', models.TextField()),
                ('evidence', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField()),
                ('actor', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('rerun_ticket', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.ticket')),
                ('inspection', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='recovery.inspection')),
                ('case', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='decisions', to='recovery.recoverycase')),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
        migrations.CreateModel(
            name='CaseEvidence',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(max_length=32)),
                ('seq', models.BigIntegerField(null=True)),
                ('detail', models.JSONField(default=dict)),
                ('at', models.DateTimeField()),
                ('case', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='evidence', to='recovery.recoverycase')),
            ],
            options={
                'verbose_name_plural': 'case evidence',
                'ordering': ['id'],
            },
        ),
        migrations.AddConstraint(
            model_name='recoverycase',
            constraint=models.UniqueConstraint(condition=models.Q(('state', 'open')), fields=('endpoint',), name='one_open_case_per_endpoint'),
        ),
        migrations.AddConstraint(
            model_name='recoverycase',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['open', 'decided', 'closed'])), name='case_state_valid'),
        ),
        AppendOnly(
            "recovery_inspection",
            "recovery_decision",
            "recovery_lesson",
            "recovery_caseevidence",
        ),
    ]
