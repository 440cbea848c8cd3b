-- The lock of an endpoint released by the turn that holds it, and the
-- endpoint's next ticket (claimcheck_next_ticket: the oldest marked queued
-- ticket, unmarked and returned for the caller to publish after commit, or
-- the dispatcher woken). The caller holds the lock row.
CREATE OR REPLACE FUNCTION claimcheck_release_lock(p_endpoint bigint, p_turn uuid)
RETURNS uuid LANGUAGE plpgsql AS $fn$
DECLARE
    v_next uuid;
BEGIN
    UPDATE runtime_endpointlock SET holder_id = NULL, token = NULL, acquired_at = NULL
    WHERE endpoint_id = p_endpoint AND holder_id = p_turn;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lock of endpoint % is not held by turn %', p_endpoint, p_turn;
    END IF;
    v_next := claimcheck_next_ticket(p_endpoint => p_endpoint);
    RETURN v_next;
END
$fn$;
