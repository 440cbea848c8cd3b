-- The finish's decision: what the exact turn's outcome makes of the turn
-- and the ticket, written by claimcheck_finish_write. Reads only.
--
-- An interrupted turn, or stop evidence, ends the turn stopped: the ticket
-- cancelled when its cancel was requested, else failed with the interrupt's
-- reason. A late outcome (docs/explanation/design.md) is the exception: a
-- success, failure or wait of an interrupting turn whose runner returned
-- before the interrupt was requested, within budget + grace, is applied as
-- any other. Otherwise the outcome is applied: wait -> waiting, success ->
-- succeeded, failure -> failed, each with its context entry.
CREATE OR REPLACE FUNCTION claimcheck_finish_outcome(
    p_ticket tickets_ticket, p_turn runtime_turn, p_kind text,
    p_result jsonb, p_artifacts jsonb, p_error jsonb, p_evidence jsonb,
    p_children jsonb, p_continuation jsonb, p_digest text,
    p_ran_s double precision, p_timing jsonb, p_returned_by timestamptz, p_now timestamptz,
    OUT o_turn_state text, OUT o_to text, OUT o_kind text, OUT o_detail jsonb,
    OUT o_error jsonb, OUT o_result jsonb, OUT o_artifacts jsonb, OUT o_context jsonb,
    OUT o_stop_evidence jsonb
) LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    u runtime_turn := p_turn;
    v_budget_s double precision;
    v_grace_s double precision;
    v_late boolean := false;
    v_mark jsonb := jsonb_build_object('outcome_sha256', p_digest);
    v_evidence jsonb;
    v_reason text;
    v_signals jsonb;
BEGIN
    -- The endpoint's budget, read only when an interrupt or a stop needs it.
    IF u.state = 'interrupting' OR p_kind = 'stopped' THEN
        SELECT e.turn_budget_s, e.interrupt_grace_s INTO v_budget_s, v_grace_s
        FROM endpoints_endpoint e WHERE e.id = u.endpoint_id;
    END IF;
    IF u.state = 'interrupting' AND p_kind IN ('success', 'failure', 'wait')
            AND p_returned_by IS NOT NULL AND u.interrupt_requested_at IS NOT NULL
            AND p_ran_s <= v_budget_s + v_grace_s
            AND p_returned_by < u.interrupt_requested_at THEN
        v_late := true;
        v_mark := v_mark || jsonb_build_object('late', p_timing || jsonb_build_object(
            'interrupt_requested_at',
            to_char(u.interrupt_requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'reason', u.interrupt_reason));
    END IF;

    IF (u.state = 'interrupting' AND NOT v_late) OR p_kind = 'stopped' THEN
        v_evidence := COALESCE(p_evidence, jsonb_build_object('kind', 'runner_returned',
            'detail', jsonb_build_object('returned', p_kind, 'after_interrupt', true) || p_timing));
        o_turn_state := 'stopped';
        o_stop_evidence := v_evidence || jsonb_build_object(
            'observed_at', to_char(p_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'seq', u.seq);
        IF p_ticket.cancel_requested_at IS NOT NULL THEN
            o_to := 'cancelled';
            o_error := claimcheck_ticket_cancelled_error(p_actor => COALESCE((
                SELECT ev.actor FROM tickets_ticketevent ev
                WHERE ev.ticket_id = p_ticket.id AND ev.kind = 'cancel_requested'
                ORDER BY ev.id DESC LIMIT 1), 'unknown'));
        ELSE
            v_reason := COALESCE(NULLIF(u.interrupt_reason, ''), 'stopped');
            v_signals := COALESCE(v_evidence->'detail'->'signals_sent', '[]');
            IF jsonb_typeof(v_signals) <> 'array' THEN v_signals := '[]'; END IF;
            o_to := 'failed';
            o_error := jsonb_build_object(
                'code', CASE v_reason WHEN 'deadline' THEN 'timed_out'
                    WHEN 'heartbeat' THEN 'heartbeat_lost' WHEN 'shutdown' THEN 'interrupted'
                    ELSE v_reason END,
                'detail', format('turn %s was interrupted (%s) and stopped%s', u.seq, v_reason,
                    CASE WHEN jsonb_array_length(v_signals) > 0
                         THEN ' by ' || (SELECT string_agg(s, ', ') FROM jsonb_array_elements_text(v_signals) s)
                         ELSE '' END),
                'budget_s', v_budget_s);
            IF jsonb_array_length(v_signals) > 0 THEN
                o_error := o_error || jsonb_build_object('signals', v_signals);
            END IF;
            IF v_reason = 'superseded' THEN
                -- The ticket whose admission asked (its interrupt_requested
                -- event: runtime/turns/budgets.py, supersede_turn).
                o_error := o_error || jsonb_build_object('by', (
                    SELECT ev.detail->>'by' FROM tickets_ticketevent ev
                    WHERE ev.ticket_id = p_ticket.id AND ev.turn_id = u.id
                      AND ev.kind = 'interrupt_requested'
                    ORDER BY ev.id DESC LIMIT 1));
            END IF;
        END IF;
        o_kind := 'turn_stopped';
        -- outcome and returned_by at the top: what audit_ledger's
        -- discarded_result check reads.
        o_detail := jsonb_build_object('evidence', v_evidence, 'outcome', p_kind) || p_timing || v_mark;
    ELSIF p_kind = 'wait' THEN
        o_turn_state := 'completed'; o_to := 'waiting'; o_kind := 'waiting_for_children';
        o_context := jsonb_build_object('waiting_for', p_children);
        o_detail := jsonb_build_object('children', p_children, 'continuation', p_continuation) || v_mark;
    ELSIF p_kind = 'success' THEN
        o_turn_state := 'completed'; o_to := 'succeeded'; o_kind := 'turn_completed';
        o_context := p_result; o_result := p_result; o_artifacts := COALESCE(p_artifacts, '[]');
        o_detail := v_mark;
    ELSE
        o_turn_state := 'failed'; o_to := 'failed'; o_kind := 'turn_failed';
        o_error := p_error;
        o_context := jsonb_build_object('error', p_error);
        o_detail := v_mark;
    END IF;
END
$fn$;
