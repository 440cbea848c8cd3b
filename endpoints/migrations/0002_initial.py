"""The endpoint tables' references to tickets (a second migration: tickets
reference endpoints and turns, so the two apps' tables are created in
three steps, endpoints, tickets, then these), and the turn's functions.

A turn's start and finish as PL/pgSQL functions: the one implementation of
each (``endpoints.runtime.start.start_turn`` and ``finish.finish_turn`` call
them), and the release of an endpoint's lock they share with the recovery
paths (``dispatch.release_lock``).

Functions rather than statements sent by the client: PL/pgSQL keeps each
statement's plan in the server session, so a connection plans them once
without protocol-level prepared statements, which PgBouncer in transaction
mode (1.18) does not carry (docs/design.md, "One implementation")."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


RELEASE_LOCK = r"""
-- The lock of an endpoint released by the turn that holds it, and the
-- endpoint's next ticket: the oldest queued ticket marked needs_dispatch is
-- unmarked and returned (the caller publishes it after commit); none marked,
-- the dispatcher is woken at commit (an admission committing now may have
-- been invisible here). The caller holds the lock row.
CREATE OR REPLACE FUNCTION claimcheck_release_lock(p_endpoint bigint, p_turn uuid)
RETURNS uuid LANGUAGE plpgsql AS $fn$
DECLARE
    v_next uuid;
BEGIN
    UPDATE endpoints_endpointlock SET holder_id = NULL, token = NULL, acquired_at = NULL
    WHERE endpoint_id = p_endpoint AND holder_id = p_turn;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lock of endpoint % is not held by turn %', p_endpoint, p_turn;
    END IF;
    UPDATE tickets_ticket t SET needs_dispatch = false
    WHERE t.id = (
        SELECT w.id FROM tickets_ticket w
        WHERE w.endpoint_id = p_endpoint AND w.state = 'queued' AND w.needs_dispatch
        ORDER BY w.id LIMIT 1)
    RETURNING t.id INTO v_next;
    IF v_next IS NULL THEN
        PERFORM pg_notify('claimcheck_dispatch', '');
    END IF;
    RETURN v_next;
END
$fn$;
"""

START_TURN = r"""
CREATE OR REPLACE FUNCTION claimcheck_start_turn(
    p_ticket uuid, p_turn uuid, p_task text, p_worker jsonb, p_token_sha256 text,
    p_actor text, p_node text, p_pid integer
) RETURNS TABLE (o_endpoint endpoints_endpoint, o_turn endpoints_turn, o_ticket tickets_ticket)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH msg AS (
    SELECT t.endpoint_id FROM tickets_ticket t WHERE t.id = p_ticket AND t.state = 'queued'
),
lk AS (
    SELECT l.endpoint_id, l.holder_id FROM endpoints_endpointlock l
    WHERE l.endpoint_id = (SELECT endpoint_id FROM msg)
    FOR UPDATE
),
tk AS (
    SELECT t.id, t.budget_s FROM tickets_ticket t
    WHERE t.endpoint_id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      AND t.state = 'queued'
    ORDER BY t.id LIMIT 1
    FOR UPDATE SKIP LOCKED
),
ep AS (
    UPDATE endpoints_endpoint e SET turn_seq = e.turn_seq + 1
    WHERE e.id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      AND e.state = 'available' AND EXISTS (SELECT 1 FROM tk)
    -- The clock is read once the lock row is ours: the turn lies inside its tenure.
    RETURNING e AS row, e.id, e.turn_seq, e.runner, e.turn_budget_s, clock_timestamp() AS now
),
tn AS (
    INSERT INTO endpoints_turn AS u (
        id, endpoint_id, ticket_id, seq, state, runner_kind, celery_task_id, worker,
        started_at, heartbeat_at, deadline_at, interrupt_requested_at, interrupt_reason,
        ended_at, stop_evidence, token_sha256)
    SELECT p_turn, ep.id, tk.id, ep.turn_seq, 'running', COALESCE(ep.runner->>'kind', ''),
        p_task, p_worker, ep.now, ep.now,
        ep.now + make_interval(secs => LEAST(ep.turn_budget_s, COALESCE(tk.budget_s, ep.turn_budget_s))), NULL, '', NULL, NULL, p_token_sha256
    FROM ep, tk
    RETURNING u AS row, u.id, u.seq, u.ticket_id, u.endpoint_id, u.started_at
),
-- No "holder_id IS NULL" here: an UPDATE tests its WHERE on the row as the
-- statement's snapshot saw it, which may still show the holder that released
-- the lock while lk waited. lk has the row locked and saw it free.
-- The rows are found by key through uncorrelated sub-selects of tn, never
-- joined to it: as a join the planner (estimating one queued ticket) scanned
-- the endpoint's whole queued index for the ticket, O(backlog) per start.
hold AS (
    UPDATE endpoints_endpointlock l SET holder_id = u.id, token = u.seq, acquired_at = u.started_at
    FROM tn u WHERE l.endpoint_id = (SELECT endpoint_id FROM tn)
),
tu AS (
    UPDATE tickets_ticket t
    SET state = 'running', turn_id = u.id, updated_at = u.started_at, version = t.version + 1
    FROM tn u WHERE t.id = (SELECT ticket_id FROM tn) AND t.state = 'queued'
    RETURNING t AS row, t.id
),
ev AS (
    INSERT INTO tickets_ticketevent (
        ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
    SELECT t.id, 'turn_started', 'queued', 'running', p_actor, u.id,
        jsonb_build_object('seq', u.seq), u.started_at
    FROM tu t, tn u
    -- Every event wakes its ticket's watchers (tickets/waits.py) at commit:
    -- evaluated for the row inserted, though nothing reads it.
    RETURNING pg_notify('claimcheck_ticket', ticket_id::text)
),
-- The message was used up without starting its ticket: the next release
-- publishes it (lock held, endpoint not available, or an older ticket first).
mk AS (
    UPDATE tickets_ticket t SET needs_dispatch = true
    WHERE t.id = p_ticket AND t.state = 'queued'
      AND EXISTS (SELECT 1 FROM lk)
      AND (EXISTS (SELECT 1 FROM lk WHERE holder_id IS NOT NULL)
           OR (EXISTS (SELECT 1 FROM tk)
               AND NOT EXISTS (SELECT 1 FROM tn WHERE tn.ticket_id = p_ticket)))
),
-- The worker registry: this pool process now runs the turn (no row outside a worker).
sl AS (
    INSERT INTO endpoints_workerslot (worker_id, pid, turn_id, since, updated_at)
    SELECT w.id, p_pid, u.id, u.started_at, u.started_at
    FROM endpoints_worker w, tn u WHERE w.name = p_node
    ON CONFLICT (worker_id, pid) DO UPDATE
    SET turn_id = EXCLUDED.turn_id, since = EXCLUDED.since, updated_at = EXCLUDED.updated_at
)
SELECT ep.row, u.row, t.row FROM ep, tn u, tu t;
END
$fn$;
"""

FINISH_TURN = r"""
CREATE OR REPLACE FUNCTION claimcheck_finish_turn(
    p_ticket uuid, p_endpoint bigint, p_turn uuid, p_seq bigint,
    p_kind text, p_result jsonb, p_artifacts jsonb, p_error jsonb, p_evidence jsonb,
    p_children jsonb, p_continuation jsonb, p_stale_detail jsonb,
    p_digest text, p_source text, p_ran_s double precision,
    p_delivery uuid, p_node text, p_pid integer
) RETURNS TABLE (
    o_status text, o_state text, o_turn_state text, o_next uuid, o_delivery uuid,
    o_due boolean, o_reason text
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    t tickets_ticket;
    l endpoints_endpointlock;
    u endpoints_turn;
    e endpoints_endpoint;
    v_now timestamptz;
    v_actor text := 'turn:' || p_seq || ':' || p_source;
    v_timing jsonb := '{}';
    v_returned_by timestamptz;
    v_late boolean := false;
    v_mark jsonb := jsonb_build_object('outcome_sha256', p_digest);
    v_to text;
    v_kind text;
    v_turn_state text;
    v_detail jsonb;
    v_error jsonb;
    v_result jsonb;
    v_context jsonb;
    v_artifacts jsonb;
    v_evidence jsonb;
    v_reason text;
    v_signals jsonb;
    v_del_id uuid;
    v_del_mode text;
    v_del_state text;
    v_del_due boolean := false;
    v_opened_json jsonb;
    v_next uuid;
BEGIN
    -- 1. Lock ticket, lock row, turn, in that order (every path that takes
    --    more than one of them takes them so).
    SELECT * INTO t FROM tickets_ticket WHERE id = p_ticket FOR UPDATE;
    SELECT * INTO l FROM endpoints_endpointlock WHERE endpoint_id = p_endpoint FOR UPDATE;
    SELECT * INTO u FROM endpoints_turn WHERE id = p_turn FOR UPDATE;
    IF t.id IS NULL OR u.id IS NULL OR u.ticket_id <> p_ticket OR u.endpoint_id <> p_endpoint THEN
        RETURN QUERY SELECT 'missing', NULL::text, NULL::text, NULL::uuid, NULL::uuid, false,
            format('turn %s of ticket %s does not exist', p_turn, p_ticket);
        RETURN;
    END IF;
    SELECT * INTO e FROM endpoints_endpoint WHERE id = p_endpoint;
    v_now := clock_timestamp();
    IF p_ran_s IS NOT NULL AND p_ran_s >= 0 THEN
        v_returned_by := u.started_at + make_interval(secs => p_ran_s);
        v_timing := jsonb_build_object('ran_s', round(p_ran_s::numeric, 3),
            'returned_by', to_char(v_returned_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'));
    END IF;

    -- 2. Exact: ticket.turn, lock.holder and the turn are one, the lock
    --    token, the turn's seq and the given seq are equal, the turn active.
    IF NOT (t.turn_id = u.id AND l.holder_id = u.id AND l.token = u.seq AND u.seq = p_seq
            AND u.state IN ('running', 'interrupting')) THEN
        IF u.seq = p_seq AND u.state NOT IN ('running', 'interrupting') AND EXISTS (
                SELECT 1 FROM tickets_ticketevent ev
                WHERE ev.ticket_id = p_ticket AND ev.turn_id = u.id
                  AND ev.detail->>'outcome_sha256' = p_digest) THEN
            -- This very outcome was recorded by an earlier attempt whose reply was lost.
            RETURN QUERY SELECT 'duplicate', t.state::text, u.state::text, NULL::uuid, NULL::uuid,
                false, ''::text;
            RETURN;
        END IF;
        v_reason := CASE
            WHEN u.state NOT IN ('running', 'interrupting') OR l.token IS DISTINCT FROM p_seq
            THEN format('turn %s is %s; seq %s vs current %s', u.id, u.state, p_seq,
                        COALESCE(l.token::text, 'None'))
            ELSE format('turn %s is not the exact turn of ticket %s', u.id, t.id) END;
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
        VALUES (p_ticket, 'stale_outcome', '', '', p_source, u.id,
            jsonb_build_object('seq', p_seq, 'turn_state', u.state, 'outcome', p_kind)
                || p_stale_detail || v_timing, v_now);
        PERFORM pg_notify('claimcheck_ticket', p_ticket::text);
        RETURN QUERY SELECT 'stale', t.state::text, u.state::text, NULL::uuid, NULL::uuid, false,
            v_reason;
        RETURN;
    END IF;

    -- 3. A late outcome (docs/design.md): the runner returned before the
    --    interrupt was requested, within budget + grace.
    IF u.state = 'interrupting' AND p_kind IN ('success', 'failure', 'wait')
            AND v_returned_by IS NOT NULL AND u.interrupt_requested_at IS NOT NULL
            AND p_ran_s <= e.turn_budget_s + e.interrupt_grace_s
            AND v_returned_by < u.interrupt_requested_at THEN
        v_late := true;
        v_mark := v_mark || jsonb_build_object('late', v_timing || jsonb_build_object(
            'interrupt_requested_at',
            to_char(u.interrupt_requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'reason', u.interrupt_reason));
    END IF;

    IF (u.state = 'interrupting' AND NOT v_late) OR p_kind = 'stopped' THEN
        -- An interrupted turn, or stop evidence: the turn ends stopped.
        v_evidence := COALESCE(p_evidence, jsonb_build_object('kind', 'runner_returned',
            'detail', jsonb_build_object('returned', p_kind, 'after_interrupt', true) || v_timing));
        v_turn_state := 'stopped';
        UPDATE endpoints_turn SET state = 'stopped', ended_at = v_now,
            stop_evidence = v_evidence || jsonb_build_object(
                'observed_at', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                'seq', u.seq)
        WHERE id = u.id;
        IF t.cancel_requested_at IS NOT NULL THEN
            v_to := 'cancelled';
            v_error := '{"code": "cancelled", "detail": "cancelled"}';
        ELSE
            v_reason := COALESCE(NULLIF(u.interrupt_reason, ''), 'stopped');
            v_signals := COALESCE(v_evidence->'detail'->'signals_sent', '[]');
            IF jsonb_typeof(v_signals) <> 'array' THEN v_signals := '[]'; END IF;
            v_to := 'failed';
            v_error := jsonb_build_object(
                'code', CASE v_reason WHEN 'deadline' THEN 'timed_out'
                    WHEN 'heartbeat' THEN 'heartbeat_lost' WHEN 'shutdown' THEN 'interrupted'
                    ELSE v_reason END,
                'detail', format('turn %s was interrupted (%s) and stopped%s', u.seq, v_reason,
                    CASE WHEN jsonb_array_length(v_signals) > 0
                         THEN ' by ' || (SELECT string_agg(s, ', ') FROM jsonb_array_elements_text(v_signals) s)
                         ELSE '' END),
                'budget_s', e.turn_budget_s);
            IF jsonb_array_length(v_signals) > 0 THEN
                v_error := v_error || jsonb_build_object('signals', v_signals);
            END IF;
        END IF;
        v_kind := 'turn_stopped';
        -- outcome and returned_by at the top: what audit_ledger's
        -- discarded_result check reads.
        v_detail := jsonb_build_object('evidence', v_evidence, 'outcome', p_kind) || v_timing || v_mark;
    ELSE
        -- 4. The outcome applied: the turn ends, its context entry is appended.
        IF p_kind = 'wait' THEN
            v_turn_state := 'completed'; v_to := 'waiting'; v_kind := 'waiting_for_children';
            v_context := jsonb_build_object('waiting_for', p_children);
            v_detail := jsonb_build_object('children', p_children, 'continuation', p_continuation) || v_mark;
        ELSIF p_kind = 'success' THEN
            v_turn_state := 'completed'; v_to := 'succeeded'; v_kind := 'turn_completed';
            v_context := p_result; v_result := p_result; v_artifacts := COALESCE(p_artifacts, '[]');
            v_detail := v_mark;
        ELSE
            v_turn_state := 'failed'; v_to := 'failed'; v_kind := 'turn_failed';
            v_error := p_error;
            v_context := jsonb_build_object('error', p_error);
            v_detail := v_mark;
        END IF;
        UPDATE endpoints_turn SET state = v_turn_state, ended_at = v_now WHERE id = u.id;
        INSERT INTO endpoints_contextentry (
            endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
        VALUES (p_endpoint, u.id, t.id, u.seq, t.input, v_context,
            CASE WHEN p_kind = 'success' THEN v_artifacts ELSE '[]'::jsonb END, v_now);
    END IF;

    -- The ticket's transition, running -> v_to, with its event; a terminal
    -- ticket that answers a requester (a root, or a re-run carrying its
    -- original's obligation) opens its delivery in the same transaction.
    IF v_to <> 'waiting' AND (t.parent_id IS NULL
            OR (t.rerun_of_id IS NOT NULL AND t.obligation_state <> 'none')) THEN
        SELECT o_id, o_mode, o_state, o_due INTO v_del_id, v_del_mode, v_del_state, v_del_due
        FROM claimcheck_open_delivery(t.id, p_delivery, v_now);
        IF v_del_id IS NOT NULL THEN
            v_opened_json := jsonb_build_object('mode', v_del_mode, 'state', v_del_state);
            v_detail := v_detail || jsonb_build_object('delivery_opened', v_opened_json);
        END IF;
    END IF;
    UPDATE tickets_ticket SET
        state = v_to, updated_at = v_now,
        version = version + CASE WHEN v_opened_json IS NULL THEN 1 ELSE 2 END,
        finished_at = CASE WHEN v_to = 'waiting' THEN finished_at ELSE v_now END,
        result = CASE WHEN v_to = 'succeeded' THEN v_result ELSE result END,
        artifacts = CASE WHEN v_to = 'succeeded' THEN v_artifacts ELSE artifacts END,
        error = CASE WHEN v_to IN ('failed', 'cancelled') THEN v_error ELSE error END,
        delivery_state = COALESCE(v_del_state, delivery_state)
    WHERE id = t.id AND state = 'running';
    IF NOT FOUND THEN  -- the row is locked and was checked above: a miss is a bug
        RAISE EXCEPTION 'ticket % is no longer running', t.id;
    END IF;
    INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
    VALUES (t.id, v_kind, 'running', v_to, v_actor, u.id, v_detail, v_now);
    PERFORM pg_notify('claimcheck_ticket', t.id::text);

    -- 5. Release the lock; the endpoint's next ticket, and this worker's registry slot idle.
    v_next := claimcheck_release_lock(p_endpoint, u.id);
    INSERT INTO endpoints_workerslot (worker_id, pid, turn_id, since, updated_at)
    SELECT w.id, p_pid, NULL, v_now, v_now FROM endpoints_worker w WHERE w.name = p_node
    ON CONFLICT (worker_id, pid) DO UPDATE
    SET turn_id = EXCLUDED.turn_id, since = EXCLUDED.since, updated_at = EXCLUDED.updated_at;

    RETURN QUERY SELECT 'finished', v_to, v_turn_state, v_next, v_del_id,
        COALESCE(v_del_due, false), ''::text;
END
$fn$;
"""


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
        migrations.RunSQL(
            RELEASE_LOCK, reverse_sql="DROP FUNCTION claimcheck_release_lock(bigint, uuid)"
        ),
        migrations.RunSQL(
            START_TURN,
            reverse_sql="DROP FUNCTION claimcheck_start_turn("
            "uuid, uuid, text, jsonb, text, text, text, integer)",
        ),
        migrations.RunSQL(
            FINISH_TURN,
            reverse_sql="DROP FUNCTION claimcheck_finish_turn(uuid, bigint, uuid, bigint, text,"
            " jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, text, text, double precision,"
            " uuid, text, integer)",
        ),
    ]
