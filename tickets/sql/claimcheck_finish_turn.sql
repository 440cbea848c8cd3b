CREATE OR REPLACE FUNCTION claimcheck_finish_turn(
    p_ticket uuid, p_endpoint bigint, p_turn uuid, p_seq bigint,
    p_kind text, p_result jsonb, p_artifacts jsonb, p_error jsonb, p_evidence jsonb,
    p_children jsonb, p_continuation jsonb, p_stale_detail jsonb,
    p_digest text, p_source text, p_ran_s double precision,
    p_delivery uuid, p_node text, p_pid integer,
    p_next_turn uuid, p_task text, p_worker jsonb, p_next_token_sha256 text, p_next_actor text
) RETURNS TABLE (
    o_status text, o_state text, o_turn_state text, o_next uuid, o_delivery uuid,
    o_due boolean, o_reason text,
    o_next_endpoint endpoints_endpoint, o_next_turn runtime_turn, o_next_ticket tickets_ticket
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    t tickets_ticket;
    l runtime_endpointlock;
    u runtime_turn;
    v_budget_s double precision;
    v_grace_s double precision;
    v_now timestamptz;
    v_stop_evidence jsonb;
    v_updated integer;
    v_rows record;
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
    v_started record;
BEGIN
    -- 1. Lock ticket, lock row, turn, in that order (every path that takes
    --    more than one of them takes them so), in one statement: a locking
    --    clause locks the rows of each result row in the order of its OF
    --    list, and re-reads the latest version of a row it waited for.
    --    Every endpoint has its lock row: none found is a missing turn.
    SELECT tt AS t, ll AS l, uu AS u INTO v_rows
    FROM tickets_ticket tt, runtime_endpointlock ll, runtime_turn uu
    WHERE tt.id = p_ticket AND ll.endpoint_id = p_endpoint AND uu.id = p_turn
    FOR UPDATE OF tt, ll, uu;
    IF FOUND THEN
        t := v_rows.t; l := v_rows.l; u := v_rows.u;
    END IF;
    IF t.id IS NULL OR u.id IS NULL OR u.ticket_id <> p_ticket OR u.endpoint_id <> p_endpoint THEN
        o_status := 'missing'; o_due := false;
        o_reason := format('turn %s of ticket %s does not exist', p_turn, p_ticket);
        RETURN NEXT;
        RETURN;
    END IF;
    -- The endpoint's budget, read only when an interrupt or a stop needs it.
    IF u.state = 'interrupting' OR p_kind = 'stopped' THEN
        SELECT e.turn_budget_s, e.interrupt_grace_s INTO v_budget_s, v_grace_s
        FROM endpoints_endpoint e WHERE e.id = p_endpoint;
    END IF;
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
            o_status := 'duplicate'; o_state := t.state; o_turn_state := u.state;
            o_due := false; o_reason := '';
            RETURN NEXT;
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
        o_status := 'stale'; o_state := t.state; o_turn_state := u.state;
        o_due := false; o_reason := v_reason;
        RETURN NEXT;
        RETURN;
    END IF;

    -- 3. A late outcome (docs/explanation/design.md): the runner returned before the
    --    interrupt was requested, within budget + grace.
    IF u.state = 'interrupting' AND p_kind IN ('success', 'failure', 'wait')
            AND v_returned_by IS NOT NULL AND u.interrupt_requested_at IS NOT NULL
            AND p_ran_s <= v_budget_s + v_grace_s
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
        v_stop_evidence := v_evidence || jsonb_build_object(
            'observed_at', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'seq', u.seq);
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
                'budget_s', v_budget_s);
            IF jsonb_array_length(v_signals) > 0 THEN
                v_error := v_error || jsonb_build_object('signals', v_signals);
            END IF;
            IF v_reason = 'superseded' THEN
                -- The ticket whose admission asked (its interrupt_requested
                -- event: runtime/turns/budgets.py, supersede_turn).
                v_error := v_error || jsonb_build_object('by', (
                    SELECT ev.detail->>'by' FROM tickets_ticketevent ev
                    WHERE ev.ticket_id = p_ticket AND ev.turn_id = u.id
                      AND ev.kind = 'interrupt_requested'
                    ORDER BY ev.id DESC LIMIT 1));
            END IF;
        END IF;
        v_kind := 'turn_stopped';
        -- outcome and returned_by at the top: what audit_ledger's
        -- discarded_result check reads.
        v_detail := jsonb_build_object('evidence', v_evidence, 'outcome', p_kind) || v_timing || v_mark;
    ELSE
        -- 4. The outcome applied: the turn ends, its context entry is
        --    appended (below, in the statement that writes the rest).
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
    END IF;

    -- The ticket's transition, running -> v_to, with its event; a terminal
    -- ticket that answers a requester (a root, or a re-run carrying its
    -- original's obligation) opens its delivery in the same transaction.
    IF v_to <> 'waiting' AND (t.parent_id IS NULL
            OR (t.rerun_of_id IS NOT NULL AND t.obligation_state <> 'none')) THEN
        SELECT o_id, o_mode, o_state, o_due INTO v_del_id, v_del_mode, v_del_state, v_del_due
        FROM claimcheck_open_delivery(p_ticket => t.id, p_delivery => p_delivery, p_now => v_now);
        IF v_del_id IS NOT NULL THEN
            v_opened_json := jsonb_build_object('mode', v_del_mode, 'state', v_del_state);
            v_detail := v_detail || jsonb_build_object('delivery_opened', v_opened_json);
        END IF;
    END IF;
    -- One statement writes the rest: the turn ends (with its stop evidence,
    -- or its context entry), the ticket's transition and its event (its
    -- watchers are woken after commit: runtime/turns/finish.py), and this
    -- worker's registry slot idle (a turn run outside a worker has none).
    -- The ticket row is locked and was checked above: a miss is a bug.
    WITH tn AS (
        UPDATE runtime_turn SET state = v_turn_state, ended_at = v_now,
            stop_evidence = COALESCE(v_stop_evidence, stop_evidence)
        WHERE id = u.id
    ),
    ce AS (
        INSERT INTO runtime_contextentry (
            endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
        SELECT p_endpoint, u.id, t.id, u.seq, t.input, v_context,
            CASE WHEN p_kind = 'success' THEN v_artifacts ELSE '[]'::jsonb END, v_now
        WHERE v_turn_state <> 'stopped'
    ),
    tu AS (
        UPDATE tickets_ticket SET
            state = v_to, updated_at = v_now,
            finished_at = CASE WHEN v_to = 'waiting' THEN finished_at ELSE v_now END,
            result = CASE WHEN v_to = 'succeeded' THEN v_result ELSE result END,
            artifacts = CASE WHEN v_to = 'succeeded' THEN v_artifacts ELSE artifacts END,
            error = CASE WHEN v_to IN ('failed', 'cancelled') THEN v_error ELSE error END,
            delivery_state = COALESCE(v_del_state, delivery_state)
        WHERE id = t.id AND state = 'running'
        RETURNING id
    ),
    ev AS (
        INSERT INTO tickets_ticketevent (
            ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
        SELECT tu.id, v_kind, 'running', v_to, v_actor, u.id, v_detail, v_now FROM tu
    ),
    sl AS (
        INSERT INTO runtime_workerslot (worker_id, pid, turn_id, since, updated_at)
        SELECT w.id, p_pid, NULL, v_now, v_now FROM runtime_worker w
        WHERE p_node <> '' AND w.name = p_node
        ON CONFLICT (worker_id, pid) DO UPDATE
        SET turn_id = EXCLUDED.turn_id, since = EXCLUDED.since, updated_at = EXCLUDED.updated_at
    )
    SELECT count(*) INTO v_updated FROM tu;
    IF v_updated = 0 THEN
        RAISE EXCEPTION 'ticket % is no longer running', t.id;
    END IF;

    -- 5. Release the lock: the endpoint's next ticket. With p_next_turn the
    --    worker that finishes starts it here, in this transaction: the same
    --    start as a message's (claimcheck_start_turn, with every guard of
    --    its own: the endpoint available and not paused, the oldest queued
    --    ticket first, the message's ticket marked when another starts or
    --    none does), the new turn carrying this worker's task id. Nothing is
    --    then left to publish.
    v_next := claimcheck_release_lock(p_endpoint => p_endpoint, p_turn => u.id);
    IF v_next IS NOT NULL AND p_next_turn IS NOT NULL THEN
        SELECT s.o_endpoint, s.o_turn, s.o_ticket INTO v_started
        FROM claimcheck_start_turn(p_ticket => v_next, p_turn => p_next_turn,
            p_task => p_task, p_worker => p_worker, p_token_sha256 => p_next_token_sha256,
            p_actor => p_next_actor, p_node => p_node, p_pid => p_pid) s;
        IF FOUND THEN
            o_next_endpoint := v_started.o_endpoint;
            o_next_turn := v_started.o_turn;
            o_next_ticket := v_started.o_ticket;
        END IF;
        v_next := NULL;
    END IF;

    o_status := 'finished'; o_state := v_to; o_turn_state := v_turn_state; o_next := v_next;
    o_delivery := v_del_id; o_due := COALESCE(v_del_due, false); o_reason := '';
    RETURN NEXT;
END
$fn$;
