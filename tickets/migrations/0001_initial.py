"""The ledger's tables, and what the database holds of its rules besides.

The turns, the endpoint's lock and its history keep the table names they
had when the runtime's migration created them (``runtime_turn``,
``runtime_endpointlock``, ``runtime_contextentry``): a database migrated
before the ledger took them over has them from runtime's 0001 and 0002 as
they were then, a fresh one from here; both are the same schema
(tests/config/test_schema_upgrade.py), and 0007 moves their content types.

- every endpoint has its lock row from its creation on: turns lock it,
  never create it. The directory (endpoints.services) does not know the
  lock, so the ledger's trigger on the endpoint table inserts it, as a
  receiver of the directory's inserts (the directory's migrations and
  code never name the lock);
- the append-only triggers of events and delivery attempts
  (core/append_only.py);
- the GIN indexes (jsonb_path_ops) of the ticket's input and result, for
  the search by key and value (tickets/search.py):
  ``input @> '{"customer": 42}'``;
- ``claimcheck_search_document(submitter, endpoint, input, result)`` and
  its GIN (jsonb_path_ops) index ticket_search_scoped_idx: the input and
  result under the submitter's and the endpoint's name
  (``{"s42": {"input": ...}, "e7": {...}}``), so a term is looked up among
  the tickets a caller may see, not among every ticket (tickets/search.py).
  The function is SQL of built-in immutable functions only, so PostgreSQL
  inlines it and the query's expression is the index's; it is defined here,
  not in tickets/sql/, because an index depends on it and that folder's
  installer replaces a changed function;
- two expression indexes the console's search and delivery filter read:
  ticket_id_tail_idx, the id's last group (its last twelve characters, 48
  random bits of a UUIDv7) reversed, so a search by the id's tail, as the
  pages print it (``…36ada1f2``), is a prefix range scan (the search checks
  the whole tail on the rows it finds: tickets.selectors.find_tickets);
  ticket_delivery_idx, ``(delivery_state, id DESC)`` for the "awaiting
  approval / pending / failed" filter and the dashboard's approvals panel,
  partial: children have no delivery, and "delivered" (most finished roots)
  is common enough that walking the primary key finds a page of it at once.

The functions (admission, a turn's start and finish, the lock's release,
the next ticket, a delivery's opening, the prune: retention's one
privileged path, a SECURITY DEFINER function owned by the migrating owner
role) are in tickets/sql/, installed after every migrate
(core/sqlfunctions.py); no migration imports an app's code, so a fresh
database and an upgraded one get the same text."""

import core.ids
import django.contrib.postgres.indexes
import django.db.models.deletion
from django.conf import settings
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


EVENT_INDEXES = ("tickets_ticketevent_pkey", "tickets_ticketevent_ticket_id_b572d14b")

INDEXES = {
    "ticket_id_tail_idx": "(reverse(right(id::text, 12)) text_pattern_ops)",
    "ticket_delivery_idx": (
        "(delivery_state, id DESC) WHERE delivery_state NOT IN ('none', 'delivered')"
    ),
}


SCOPED_DOCUMENT = """
CREATE OR REPLACE FUNCTION claimcheck_search_document(
    p_submitter bigint, p_endpoint bigint, p_input jsonb, p_result jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    -- One expression of built-in immutable functions (jsonb_set, not
    -- jsonb_build_object, which is stable; text || text, not text || bigint;
    -- no FROM): PostgreSQL then inlines it, here and in the index.
    SELECT pg_catalog.jsonb_set(
        pg_catalog.jsonb_set(
            '{}'::jsonb,
            ARRAY['e' || p_endpoint::text],
            pg_catalog.jsonb_set(
                pg_catalog.jsonb_set('{"input": null, "result": null}'::jsonb, '{input}', p_input),
                '{result}', COALESCE(p_result, 'null'::jsonb))),
        ARRAY['s' || COALESCE(p_submitter::text, '')],
        pg_catalog.jsonb_set(
            pg_catalog.jsonb_set('{"input": null, "result": null}'::jsonb, '{input}', p_input),
            '{result}', COALESCE(p_result, 'null'::jsonb)))
$fn$;
"""


def _fill_event_index_pages(apps, schema_editor):
    """Events are never updated: their primary key and ticket index fill
    their pages (fillfactor 100), without the room PostgreSQL leaves for
    updates. Django builds a foreign key's index at the end of the
    migration (the schema editor's deferred statements); that one is built
    now, so it can be altered here."""
    for statement in [s for s in schema_editor.deferred_sql if EVENT_INDEXES[1] in str(s)]:
        schema_editor.execute(statement)
        schema_editor.deferred_sql.remove(statement)
    for name in EVENT_INDEXES:
        schema_editor.execute(f"ALTER INDEX {name} SET (fillfactor = 100)")


def _reset_event_index_pages(apps, schema_editor):
    for name in EVENT_INDEXES:
        schema_editor.execute(f"ALTER INDEX {name} RESET (fillfactor)")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('endpoints', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='EndpointLock',
            fields=[
                ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='lock', serialize=False, to='endpoints.endpoint')),
                ('token', models.BigIntegerField(blank=True, null=True)),
                ('acquired_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'runtime_endpointlock',
            },
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
                'db_table': 'runtime_turn',
                'ordering': ['endpoint_id', 'seq'],
            },
        ),
        migrations.RunSQL(LOCK_ROW_SQL, DROP_LOCK_ROW_SQL),
        migrations.CreateModel(
            name='Trace',
            fields=[
                ('id', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('tickets', models.PositiveIntegerField(default=0)),
                ('max_depth', models.PositiveIntegerField(default=0)),
                ('flagged', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name='Ticket',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('dedupe_key', models.CharField(blank=True, max_length=255, null=True)),
                ('input_sha256', models.CharField(max_length=64)),
                ('input', models.JSONField()),
                ('trace_id', models.CharField(max_length=64)),
                ('depth', models.PositiveIntegerField(default=0)),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('recovering', 'Recovering'), ('orphaned', 'Orphaned')], default='queued', max_length=16)),
                ('result', models.JSONField(blank=True, null=True)),
                ('error', models.JSONField(blank=True, null=True)),
                ('artifacts', models.JSONField(blank=True, default=list)),
                ('continuation', models.JSONField(blank=True, null=True)),
                ('budget_s', models.PositiveIntegerField(blank=True, null=True)),
                ('requester', models.JSONField(blank=True, default=dict)),
                ('callback_state', models.CharField(choices=[('none', 'None'), ('pending', 'Pending'), ('accepted', 'Accepted'), ('recorded', 'Recorded')], default='none', max_length=16)),
                ('delivery_state', models.CharField(choices=[('none', 'None'), ('awaiting_approval', 'Awaiting Approval'), ('pending', 'Pending'), ('attempted', 'Attempted'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='none', max_length=20)),
                ('approved_at', models.DateTimeField(blank=True, null=True)),
                ('cancel_requested_at', models.DateTimeField(blank=True, null=True)),
                ('needs_dispatch', models.BooleanField(db_default=False, default=False)),
                ('obligation_state', models.CharField(choices=[('none', 'None'), ('open', 'Open'), ('closed', 'Closed')], default='none', max_length=8)),
                ('obligation_due_at', models.DateTimeField(blank=True, null=True)),
                ('obligation_overdue', models.BooleanField(default=False)),
                ('obligation_note', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('version', models.PositiveIntegerField(default=1)),
                ('approved_by', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('callback_for', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='callback_ticket', to='tickets.ticket')),
                ('completed_by_turn', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.turn')),
                ('endpoint', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='tickets', to='endpoints.endpoint')),
                ('parent', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='children', to='tickets.ticket')),
                ('rerun_of', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='reruns', to='tickets.ticket')),
                ('retry_of', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='retries', to='tickets.ticket')),
                ('return_to', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.endpoint')),
                ('submitted_by', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('turn', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.turn')),
            ],
        ),
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.UUIDField(default=core.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('mode', models.CharField(choices=[('webhook', 'Webhook'), ('pull', 'Pull')], max_length=8)),
                ('url', models.URLField(blank=True, default='', max_length=2000)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('ticket', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='delivery', to='tickets.ticket')),
            ],
            options={
                'verbose_name_plural': 'deliveries',
            },
        ),
        migrations.CreateModel(
            name='Callback',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('created_at', models.DateTimeField()),
                ('target', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.endpoint')),
                ('source', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='callback', to='tickets.ticket')),
                ('ticket', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.ticket')),
            ],
        ),
        migrations.CreateModel(
            name='TicketEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(max_length=64)),
                ('from_state', models.CharField(blank=True, default='', max_length=16)),
                ('to_state', models.CharField(blank=True, default='', max_length=16)),
                ('actor', models.CharField(blank=True, default='', max_length=200)),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('at', models.DateTimeField()),
                ('ticket', models.ForeignKey(on_delete=django.db.models.deletion.DO_NOTHING, related_name='events', to='tickets.ticket')),
                ('turn', models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tickets.turn')),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='DeliveryAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('at', models.DateTimeField()),
                ('status_code', models.IntegerField(blank=True, null=True)),
                ('latency_ms', models.FloatField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('delivery', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='attempt_log', to='tickets.delivery')),
            ],
            options={
                'ordering': ['delivery_id', 'number'],
                'constraints': [models.UniqueConstraint(fields=('delivery', 'number'), name='attempt_number_unique')],
            },
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(fields=['endpoint', '-id'], name='ticket_endpoint_id_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('state__in', ['succeeded', 'queued']), _negated=True), fields=['state', '-id'], name='ticket_state_id_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(fields=['trace_id'], name='ticket_trace_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(fields=['submitted_by', '-id'], name='ticket_submitter_id_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('state', 'queued')), fields=['endpoint', 'id'], name='ticket_queued_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('obligation_state', 'open')), fields=['obligation_due_at'], name='ticket_obligation_open_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('obligation_overdue', False), ('obligation_state', 'open')), fields=['obligation_due_at'], name='ticket_obligation_due_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('callback_state', 'pending')), fields=['id'], name='ticket_callback_pending_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=django.contrib.postgres.indexes.GinIndex(fields=['input'], name='ticket_input_search_idx', opclasses=['jsonb_path_ops']),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('result__isnull', False)), fields=['result'], name='ticket_result_search_idx', opclasses=['jsonb_path_ops']),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('parent__isnull', False)), fields=['parent'], name='ticket_parent_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('rerun_of__isnull', False)), fields=['rerun_of'], name='ticket_rerun_of_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('return_to__isnull', False)), fields=['return_to'], name='ticket_return_to_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('completed_by_turn__isnull', False)), fields=['completed_by_turn'], name='ticket_completed_by_turn_idx'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('approved_by__isnull', False)), fields=['approved_by'], name='ticket_approved_by_idx'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.UniqueConstraint(fields=('endpoint', 'dedupe_key'), name='ticket_endpoint_dedupe_unique'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled', 'recovering', 'orphaned'])), name='ticket_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.CheckConstraint(condition=models.Q(('callback_state__in', ['none', 'pending', 'accepted', 'recorded'])), name='ticket_callback_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.CheckConstraint(condition=models.Q(('delivery_state__in', ['none', 'awaiting_approval', 'pending', 'attempted', 'delivered', 'failed'])), name='ticket_delivery_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.CheckConstraint(condition=models.Q(('obligation_state__in', ['none', 'open', 'closed'])), name='ticket_obligation_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.UniqueConstraint(condition=models.Q(('retry_of__isnull', False)), fields=('retry_of',), name='ticket_retry_of_unique'),
        ),
        migrations.AddConstraint(
            model_name='ticket',
            constraint=models.CheckConstraint(condition=models.Q(('budget_s__isnull', True), ('budget_s__gte', 1), _connector='OR'), name='ticket_budget_s_positive'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('next_attempt_at__isnull', False)), fields=['next_attempt_at'], name='delivery_due_idx'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.CheckConstraint(condition=models.Q(('mode__in', ['webhook', 'pull'])), name='delivery_mode_valid'),
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
                'db_table': 'runtime_contextentry',
                'verbose_name_plural': 'context entries',
                'ordering': ['endpoint_id', 'seq'],
            },
        ),
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
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tickets.turn'),
        ),
        migrations.AddField(
            model_name='contextentry',
            name='turn',
            field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='context_entry', to='tickets.turn'),
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
        # Events and delivery attempts are written once: UPDATE, DELETE and
        # TRUNCATE refused (core/append_only.py).
        AppendOnly("tickets_ticketevent", "tickets_deliveryattempt"),
        migrations.RunPython(_fill_event_index_pages, _reset_event_index_pages),
        *[
            migrations.RunSQL(
                f"CREATE INDEX {name} ON tickets_ticket {spec}", f"DROP INDEX {name}"
            )
            for name, spec in INDEXES.items()
        ],
        migrations.RunSQL(
            SCOPED_DOCUMENT,
            reverse_sql="DROP FUNCTION claimcheck_search_document(bigint, bigint, jsonb, jsonb)",
        ),
        # Not in Ticket.Meta.indexes: Django writes an operator class on an
        # expression only with django.contrib.postgres installed.
        migrations.RunSQL(
            "CREATE INDEX ticket_search_scoped_idx ON tickets_ticket USING gin "
            "(claimcheck_search_document(submitted_by_id, endpoint_id, input, result) "
            "jsonb_path_ops)",
            reverse_sql="DROP INDEX ticket_search_scoped_idx",
        ),
    ]
