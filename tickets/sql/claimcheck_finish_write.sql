-- The finish's write: the ticket moves running -> p_to with its event
-- (claimcheck_ticket_write, the one writer of a ticket's move and its
-- event; its watchers are woken after commit: tickets/terminal.py
-- after_move), then one statement: the turn ends (with its stop evidence,
-- or its context entry), and the pool process that sends it lets go of the
-- turn it ran (Turn.released_at, tickets/turns/slots.py; a turn run outside
-- a worker has no slot). False when the ticket was not running (the caller
-- holds the row and checked it: a bug): nothing written.
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
    v_done integer;
BEGIN
    IF NOT claimcheck_ticket_write(p_ticket => (p_ticket).id, p_expected => 'running',
            p_to => p_to, p_kind => p_kind, p_actor => p_actor, p_turn => (p_turn).id,
            p_detail => p_detail, p_now => p_now, p_error => p_error, p_result => p_result,
            p_artifacts => p_artifacts, p_completed_by_turn => NULL,
            p_delivery_state => p_delivery_state) THEN
        RETURN false;
    END IF;
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
    )
    SELECT 1 INTO v_done;
    RETURN true;
END
$fn$;
