-- The lock of an endpoint released by the turn that holds it, and the
-- endpoint's next ticket: the oldest queued ticket marked needs_dispatch is
-- unmarked and returned (the caller publishes it after commit); none marked,
-- the dispatcher is woken at commit (an admission committing now may have
-- been invisible here). A paused endpoint's tickets keep their marks: the
-- dispatcher serves them once a resume commits. The caller holds the lock row.
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
          AND (SELECT e.paused_at FROM endpoints_endpoint e WHERE e.id = p_endpoint) IS NULL
        ORDER BY w.id LIMIT 1)
    RETURNING t.id INTO v_next;
    IF v_next IS NULL THEN
        PERFORM pg_notify('claimcheck_dispatch', '');
    END IF;
    RETURN v_next;
END
$fn$;
