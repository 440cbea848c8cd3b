"""The ledger's tables, and what the database holds of its rules besides:

- the append-only triggers of events and delivery attempts
  (config/append_only.py);
- ``claimcheck_prune_ledger`` (tickets/retention.py): retention's one
  privileged path, a SECURITY DEFINER function owned by the migrating
  (owner) role; the application role is granted EXECUTE after migrate
  (config/db_roles.py);
- ``claimcheck_open_delivery``: the one place a terminal ticket's delivery
  row is written (``tickets.delivery.on_root_terminal`` and the turn's
  finish, ``claimcheck_finish_turn``, both call it);
- ``claimcheck_admit``: admission, the one implementation
  (``tickets.admission.admit_ticket`` calls it).

PL/pgSQL functions keep their statements' plans in the server session, so a
connection plans them once without protocol-level prepared statements,
which PgBouncer in transaction mode (1.18) does not carry. Their bodies are
checked when called, not when created: the endpoint and recovery tables they
read may come later in the migration plan."""

import django.db.models.deletion
import tickets.ids
from django.conf import settings
from django.db import migrations, models

from config.append_only import AppendOnly
from tickets.retention import DROP_SQL, function_sql


EVENT_INDEXES = ("tickets_ticketevent_pkey", "tickets_ticketevent_ticket_id_b572d14b")


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


def _prune_function(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT pg_catalog.current_schema()")
        schema = schema_editor.connection.ops.quote_name(cur.fetchone()[0])
    schema_editor.execute(function_sql(schema), params=None)


def _drop_prune_function(apps, schema_editor):
    schema_editor.execute(DROP_SQL, params=None)

OPEN_DELIVERY = r"""
-- The delivery of a ticket that became terminal, opened in the terminal
-- transition's transaction (the caller holds the ticket row and has checked
-- that the ticket answers a requester). Returns what the terminal event
-- records of it, or NULL when one is open already.
CREATE OR REPLACE FUNCTION claimcheck_open_delivery(p_ticket uuid, p_delivery uuid, p_now timestamptz)
RETURNS TABLE (o_id uuid, o_mode text, o_state text, o_due boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_url text;
    v_state text;
BEGIN
    IF EXISTS (SELECT 1 FROM tickets_delivery d WHERE d.ticket_id = p_ticket) THEN
        RETURN;
    END IF;
    SELECT COALESCE(t.requester->>'webhook_url', ''),
        CASE WHEN e.requires_approval AND t.approved_at IS NULL
             THEN 'awaiting_approval' ELSE 'pending' END
    INTO v_url, v_state
    FROM tickets_ticket t JOIN endpoints_endpoint e ON e.id = t.endpoint_id
    WHERE t.id = p_ticket;
    -- next_attempt_at = now though the caller publishes at once: if the
    -- publish is lost (broker down), the delivery sweep still finds it due.
    INSERT INTO tickets_delivery (
        id, ticket_id, mode, url, attempts, next_attempt_at, last_error, delivered_at, created_at)
    VALUES (p_delivery, p_ticket, CASE WHEN v_url <> '' THEN 'webhook' ELSE 'pull' END, v_url, 0,
        CASE WHEN v_url <> '' AND v_state = 'pending' THEN p_now END, '', NULL, p_now);
    RETURN QUERY SELECT p_delivery, CASE WHEN v_url <> '' THEN 'webhook' ELSE 'pull' END, v_state,
        v_url <> '' AND v_state = 'pending';
END
$fn$;
"""

ADMIT = r"""
CREATE OR REPLACE FUNCTION claimcheck_admit(
    p_id uuid, p_address text, p_dedupe_key text, p_sha text, p_input jsonb,
    p_parent uuid, p_trace text, p_return_to text, p_continuation jsonb, p_requester jsonb,
    p_callback_for uuid, p_rerun_of uuid, p_submitted_by integer, p_may_submit_restricted boolean,
    p_actor text, p_now timestamptz, p_due timestamptz, p_soft integer, p_hard integer
) RETURNS TABLE (
    o_status text, o_ticket uuid, o_endpoint bigint, o_address text, o_return_to bigint,
    o_trace text, o_depth integer, o_root boolean, o_owned boolean, o_turn_seq bigint,
    o_turn_state text, o_return_to_address text, o_row jsonb
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    e endpoints_endpoint;
    rt endpoints_endpoint;
    v_trace text;
    v_count integer;
    v_flagged boolean;
    v_refusal text;
BEGIN
    -- 1. One statement: every guard of a new ticket, and the writes (the
    --    ticket, its event, its count on the trace, the dispatcher's wake-up
    --    at commit); or, when the key is taken, the ticket holding it, whole,
    --    whatever would refuse a new one (the caller compares the input hash
    --    and decides who may see it). The guards: the endpoint (address or
    --    alias) and the return_to exist and, when restricted, the caller has
    --    asked the directory (``p_may_submit_restricted``); the endpoint is
    --    available (quarantine fails closed); a busy "reject" endpoint takes
    --    nothing (a re-run is an owner's decision, not new work); a child's
    --    parent exists and is on the trace given; the trace is under its
    --    hard limit, its row locked so admissions to one trace queue here
    --    (a new root trace has no row yet). The ledger is the outbox: the
    --    ticket owes a dispatch (needs_dispatch), no broker round trip here.
    WITH ea AS (
        SELECT e.id, e.address, e.owners_id, e.state, e.busy_policy, e.submit_restricted
        FROM endpoints_endpoint e
        WHERE e.id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_address),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_address))
          AND (p_may_submit_restricted OR NOT e.submit_restricted)
    ),
    rt AS (
        SELECT e.id, e.address FROM endpoints_endpoint e
        WHERE p_return_to IS NOT NULL AND e.id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_return_to),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_return_to))
          AND (p_may_submit_restricted OR NOT e.submit_restricted)
    ),
    pa AS (
        SELECT t.trace_id, t.depth + 1 AS depth FROM tickets_ticket t WHERE t.id = p_parent
    ),
    tv AS (
        SELECT COALESCE((SELECT trace_id FROM pa), p_trace, replace(p_id::text, '-', '')) AS id,
            COALESCE((SELECT depth FROM pa), 0) AS depth,
            p_parent IS NULL OR (p_rerun_of IS NOT NULL AND EXISTS (
                SELECT 1 FROM tickets_ticket o
                WHERE o.id = p_rerun_of AND o.obligation_state <> 'none')) AS root
    ),
    tl AS (
        SELECT tr.tickets FROM tickets_trace tr
        WHERE (p_trace IS NOT NULL OR p_parent IS NOT NULL) AND tr.id = (SELECT id FROM tv)
        FOR UPDATE
    ),
    ep AS (
        SELECT ea.id, ea.address, ea.owners_id FROM ea
        WHERE ea.state = 'available'
          AND (p_return_to IS NULL OR EXISTS (SELECT 1 FROM rt))
          AND (p_parent IS NULL OR EXISTS (
                SELECT 1 FROM pa WHERE p_trace IS NULL OR pa.trace_id = p_trace))
          AND (p_rerun_of IS NOT NULL OR ea.busy_policy = 'enqueue' OR (
                NOT EXISTS (SELECT 1 FROM endpoints_endpointlock l
                            WHERE l.endpoint_id = ea.id AND l.holder_id IS NOT NULL)
                AND NOT EXISTS (SELECT 1 FROM tickets_ticket q
                                WHERE q.endpoint_id = ea.id AND q.state = 'queued')))
          AND COALESCE((SELECT tickets FROM tl), 0) < p_hard
    ),
    ins AS (
        INSERT INTO tickets_ticket (
            id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
            artifacts, return_to_id, continuation, callback_for_id, rerun_of_id, requester,
            submitted_by_id, callback_state, delivery_state, needs_dispatch, obligation_state,
            obligation_due_at, obligation_overdue, obligation_note, created_at, updated_at,
            version)
        SELECT p_id, ep.id, p_dedupe_key, p_sha, p_input, p_parent, tv.id, tv.depth, 'queued',
            '[]'::jsonb, (SELECT id FROM rt), p_continuation, p_callback_for, p_rerun_of,
            p_requester, p_submitted_by,
            CASE WHEN p_return_to IS NOT NULL THEN 'pending' ELSE 'none' END, 'none', true,
            CASE WHEN tv.root THEN 'open' ELSE 'none' END, CASE WHEN tv.root THEN p_due END,
            false, '', p_now, p_now, 1
        FROM ep, tv
        ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
        RETURNING id, pg_notify('claimcheck_dispatch', '') IS NULL AS woke
    ),
    ev AS (
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
        SELECT id, 'admitted', '', 'queued', p_actor,
            CASE WHEN p_parent IS NOT NULL THEN jsonb_build_object('parent', p_parent::text)
                 ELSE '{}'::jsonb END, p_now
        FROM ins
    ),
    tr AS (
        INSERT INTO tickets_trace AS tr (id, tickets, max_depth, flagged, created_at)
        SELECT tv.id, 1, tv.depth, false, p_now FROM ins, tv
        ON CONFLICT (id) DO UPDATE
        SET tickets = tr.tickets + 1, max_depth = greatest(tr.max_depth, EXCLUDED.max_depth)
        RETURNING tr.tickets, tr.flagged
    )
    SELECT 'admitted', ins.id, ea.id, ea.address::text, (SELECT id FROM rt), tv.id, tv.depth,
        tv.root, false, NULL::bigint, NULL::text, (SELECT address::text FROM rt), NULL::jsonb,
        tr.tickets, tr.flagged
    FROM ins, ea, tv, tr
    UNION ALL
    -- Not inserted: the ticket that holds the key (committed before this
    -- statement began; a racing one is read again below), with what its
    -- payload and the visibility check need.
    SELECT 'existing', t.id, ea.id, ea.address::text, t.return_to_id, t.trace_id::text, t.depth,
        false,
        EXISTS (SELECT 1 FROM auth_user_groups ug
                WHERE ug.group_id = ea.owners_id AND ug.user_id = p_submitted_by),
        tu.seq, tu.state::text, rte.address::text, to_jsonb(t), NULL::integer, NULL::boolean
    FROM tickets_ticket t JOIN ea ON t.endpoint_id = ea.id
    LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
    LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
    WHERE t.dedupe_key = p_dedupe_key AND NOT EXISTS (SELECT 1 FROM ins)
      AND (p_return_to IS NULL OR EXISTS (SELECT 1 FROM rt))
    INTO o_status, o_ticket, o_endpoint, o_address, o_return_to, o_trace, o_depth, o_root,
        o_owned, o_turn_seq, o_turn_state, o_return_to_address, o_row, v_count, v_flagged;
    IF o_status = 'admitted' THEN
        -- Past the soft limit the trace is flagged once, with a warning on
        -- the ticket that passed it.
        IF v_count > p_soft AND NOT v_flagged THEN
            UPDATE tickets_trace SET flagged = true WHERE id = o_trace;
            INSERT INTO tickets_ticketevent (
                ticket_id, kind, from_state, to_state, actor, detail, at)
            VALUES (p_id, 'trace_soft_limit', '', '', 'circuit-breaker',
                jsonb_build_object('trace_id', o_trace, 'tickets', v_count, 'soft_limit', p_soft),
                p_now);
            o_status := 'admitted_flagged';
        END IF;
        RETURN NEXT;
        RETURN;
    ELSIF o_status IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- 2. Nothing written: why (reads only, each with a new snapshot).
    SELECT * INTO e FROM endpoints_endpoint WHERE id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = p_address),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_address));
    IF e.id IS NULL THEN
        RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_address,
            NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
            NULL::jsonb;
        RETURN;
    END IF;
    IF p_return_to IS NOT NULL THEN
        SELECT * INTO rt FROM endpoints_endpoint WHERE id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_return_to),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_return_to));
        IF rt.id IS NULL THEN
            RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_return_to,
                NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
                NULL::jsonb;
            RETURN;
        END IF;
    END IF;
    -- A restricted endpoint (or return_to): the caller asks the directory who
    -- may submit (endpoints.selectors.may_submit) before anything is looked
    -- up, then calls again.
    IF NOT p_may_submit_restricted AND (e.submit_restricted OR rt.submit_restricted) THEN
        RETURN QUERY SELECT 'restricted', NULL::uuid, e.id, e.address::text, rt.id, NULL::text,
            0, false, false, NULL::bigint, NULL::text, rt.address::text, jsonb_build_array(
                jsonb_build_object('id', e.id, 'address', e.address,
                    'submit_restricted', e.submit_restricted, 'owners_id', e.owners_id),
                CASE WHEN rt.id IS NOT NULL THEN jsonb_build_object('id', rt.id,
                    'address', rt.address, 'submit_restricted', rt.submit_restricted,
                    'owners_id', rt.owners_id) END);
        RETURN;
    END IF;
    -- A winner that committed while the statement above waited for it.
    IF p_dedupe_key IS NOT NULL THEN
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address::text, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
        LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
        WHERE t.endpoint_id = e.id AND t.dedupe_key = p_dedupe_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF p_parent IS NOT NULL THEN
        SELECT t.trace_id INTO v_trace FROM tickets_ticket t WHERE t.id = p_parent;
        IF NOT FOUND THEN
            v_refusal := 'parent_not_found';
        ELSIF p_trace IS NOT NULL AND p_trace <> v_trace THEN
            v_refusal := 'trace_mismatch';
        END IF;
    END IF;
    IF v_refusal IS NULL AND e.state <> 'available' THEN
        v_refusal := 'quarantined';
    END IF;
    IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy <> 'enqueue' AND (
            EXISTS (SELECT 1 FROM endpoints_endpointlock l
                    WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL)
            OR EXISTS (SELECT 1 FROM tickets_ticket q
                       WHERE q.endpoint_id = e.id AND q.state = 'queued')) THEN
        v_refusal := 'busy';
    END IF;
    v_trace := COALESCE(v_trace, p_trace);
    IF v_refusal IS NULL AND v_trace IS NOT NULL AND COALESCE(
            (SELECT tr.tickets FROM tickets_trace tr WHERE tr.id = v_trace), 0) >= p_hard THEN
        v_refusal := 'circuit_open';
    END IF;
    -- None holds now: what refused it a moment ago has changed; the caller
    -- may call again.
    RETURN QUERY SELECT COALESCE(v_refusal, 'retry'), NULL::uuid, e.id, e.address::text,
        NULL::bigint, v_trace, 0, false, false, NULL::bigint, NULL::text, NULL::text,
        NULL::jsonb;
END
$fn$;
"""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('endpoints', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
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
                ('id', models.UUIDField(default=tickets.ids.new_id, editable=False, primary_key=True, serialize=False)),
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
                ('requester', models.JSONField(blank=True, default=dict)),
                ('callback_state', models.CharField(choices=[('none', 'None'), ('pending', 'Pending'), ('accepted', 'Accepted'), ('recorded', 'Recorded')], default='none', max_length=16)),
                ('delivery_state', models.CharField(choices=[('none', 'None'), ('awaiting_approval', 'Awaiting Approval'), ('pending', 'Pending'), ('attempted', 'Attempted'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='none', max_length=20)),
                ('approved_at', models.DateTimeField(blank=True, null=True)),
                ('cancel_requested_at', models.DateTimeField(blank=True, null=True)),
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
                ('completed_by_turn', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.turn')),
                ('endpoint', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='tickets', to='endpoints.endpoint')),
                ('parent', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='children', to='tickets.ticket')),
                ('return_to', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.endpoint')),
                ('submitted_by', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('turn', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='endpoints.turn')),
                ('rerun_of', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='reruns', to='tickets.ticket')),
                ('needs_dispatch', models.BooleanField(db_default=False, default=False)),
                ('budget_s', models.PositiveIntegerField(blank=True, null=True)),
                ('retry_of', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='retries', to='tickets.ticket')),
            ],
        ),
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.UUIDField(default=tickets.ids.new_id, editable=False, primary_key=True, serialize=False)),
                ('mode', models.CharField(choices=[('webhook', 'Webhook'), ('pull', 'Pull')], max_length=8)),
                ('url', models.URLField(blank=True, default='', max_length=2000)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('ticket', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='delivery', to='tickets.ticket')),
            ],
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
                ('turn', models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='endpoints.turn')),
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
        # Events and delivery attempts are written once: UPDATE, DELETE and
        # TRUNCATE refused (config/append_only.py).
        AppendOnly("tickets_ticketevent", "tickets_deliveryattempt"),
        migrations.RunPython(_fill_event_index_pages, _reset_event_index_pages),
        migrations.RunPython(_prune_function, _drop_prune_function),
        migrations.RunSQL(
            OPEN_DELIVERY,
            reverse_sql="DROP FUNCTION claimcheck_open_delivery(uuid, uuid, timestamptz)",
        ),
        migrations.RunSQL(
            ADMIT,
            reverse_sql="DROP FUNCTION claimcheck_admit(uuid, text, text, text, jsonb, uuid, text,"
            " text, jsonb, jsonb, uuid, uuid, integer, boolean, text, timestamptz, timestamptz,"
            " integer, integer)",
        ),
    ]
