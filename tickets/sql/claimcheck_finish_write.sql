-- The finish's write, one statement: the turn ends (with its stop evidence,
-- or its context entry), the ticket moves running -> p_to with its event
-- (its watchers are woken after commit: runtime/turns/finish.py), and the
-- pool process that sends it lets go of the turn it ran (Turn.released_at,
-- tickets/turns/slots.py; a turn run outside a worker has no slot).
-- False when the ticket was not running (the caller holds the row and
-- checked it: a bug).
CREATE OR REPLACE FUNCTION claimcheck_finish_write(
    p_ticket tickets_ticket, p_turn runtime_turn,
    p_turn_state text, p_to text, p_kind text, p_detail jsonb,
    p_error jsonb, p_result jsonb, p_artifacts jsonb, p_context jsonb,
    p_stop_evidence jsonb, p_delivery_state text,
    p_actor text, p_now timestamptz, p_node text, p_pid integer
) RETURNS boolean LANGUAGE plpgsql AS $fn$
-- PL/pgSQL, not SQL: its statement's plan is kept for the session (a SQL
-- function's would be made again on every call).
DECLARE
    v_updated integer;
BEGIN
    WITH tn AS (
        UPDATE runtime_turn SET state = p_turn_state, ended_at = p_now,
            stop_evidence = COALESCE(p_stop_evidence, stop_evidence),
            released_at = CASE WHEN p_node <> '' AND slot = p_node || ':' || p_pid
                               THEN p_now ELSE released_at END
        WHERE id = (p_turn).id
    ),
    ce AS (
        INSERT INTO runtime_contextentry (
            endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
        SELECT (p_turn).endpoint_id, (p_turn).id, (p_ticket).id, (p_turn).seq,
            (p_ticket).input, p_context, COALESCE(p_artifacts, '[]'::jsonb), p_now
        WHERE p_turn_state <> 'stopped'
    ),
    tu AS (
        UPDATE tickets_ticket SET
            state = p_to, updated_at = p_now,
            finished_at = CASE WHEN p_to = 'waiting' THEN finished_at ELSE p_now END,
            result = CASE WHEN p_to = 'succeeded' THEN p_result ELSE result END,
            artifacts = CASE WHEN p_to = 'succeeded' THEN p_artifacts ELSE artifacts END,
            error = CASE WHEN p_to IN ('failed', 'cancelled') THEN p_error ELSE error END,
            delivery_state = COALESCE(p_delivery_state, delivery_state)
        WHERE id = (p_ticket).id AND state = 'running'
        RETURNING id
    ),
    ev AS (
        INSERT INTO tickets_ticketevent (
            ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
        SELECT tu.id, p_kind, 'running', p_to, p_actor, (p_turn).id, p_detail, p_now FROM tu
    )
    SELECT count(*) INTO v_updated FROM tu;
    RETURN v_updated = 1;
END
$fn$;
