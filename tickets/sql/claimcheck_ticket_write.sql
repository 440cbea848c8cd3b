-- A ticket's move written, one statement: the conditional UPDATE (WHERE
-- state = p_expected) and the transition's event. The one place both are
-- written after the start: claimcheck_ticket_move (every Python service,
-- tickets/lifecycle.py) and a turn's finish (claimcheck_finish_write) call
-- it. The fields given are written, a NULL leaves a field as it is; a
-- terminal state sets finished_at; a cancel given no error gets the one
-- cancel text (claimcheck_ticket_cancelled_error, naming p_actor).
-- p_delivery_state and the event's detail come from claimcheck_ticket_owes.
-- False when the ticket was not in p_expected: nothing written. The
-- watchers are woken after commit, by the caller (tickets/terminal.py
-- after_move: core/wakes.py says why not here).
CREATE OR REPLACE FUNCTION claimcheck_ticket_write(
    p_ticket uuid, p_expected text, p_to text, p_kind text, p_actor text, p_turn uuid,
    p_detail jsonb, p_now timestamptz, p_error jsonb, p_result jsonb, p_artifacts jsonb,
    p_completed_by_turn uuid, p_delivery_state text
) RETURNS boolean LANGUAGE plpgsql AS $fn$
-- PL/pgSQL, not SQL: its statement's plan is kept for the session (a SQL
-- function's would be made again on every call).
DECLARE
    v_moved integer;
BEGIN
    WITH tu AS (
        UPDATE tickets_ticket SET
            state = p_to, updated_at = p_now,
            finished_at = CASE WHEN p_to IN ('succeeded', 'failed', 'cancelled', 'orphaned')
                               THEN p_now ELSE finished_at END,
            result = COALESCE(p_result, result),
            artifacts = COALESCE(p_artifacts, artifacts),
            error = COALESCE(p_error, CASE WHEN p_to = 'cancelled'
                THEN claimcheck_ticket_cancelled_error(p_actor => p_actor) END, error),
            completed_by_turn_id = COALESCE(p_completed_by_turn, completed_by_turn_id),
            delivery_state = COALESCE(p_delivery_state, delivery_state)
        WHERE id = p_ticket AND state = p_expected
        RETURNING id
    ),
    ev AS (
        INSERT INTO tickets_ticketevent (
            ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
        SELECT tu.id, p_kind, p_expected, p_to, p_actor, p_turn, COALESCE(p_detail, '{}'), p_now
        FROM tu
    )
    SELECT count(*) INTO v_moved FROM tu;
    RETURN v_moved = 1;
END
$fn$;
