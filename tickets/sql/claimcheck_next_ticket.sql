-- An endpoint's next ticket, after its lock was released (the caller holds
-- the lock row): the oldest queued ticket marked needs_dispatch is unmarked
-- and returned (the caller publishes it after commit); none marked, the
-- caller wakes the dispatcher after commit (an admission committing now may
-- have been invisible here, and the dispatcher it woke may have seen the
-- lock held). No NOTIFY here: it would serialise the caller's commit.
-- A paused endpoint's tickets keep their marks: the dispatcher serves them
-- once a resume commits.
CREATE OR REPLACE FUNCTION claimcheck_next_ticket(p_endpoint bigint)
RETURNS uuid LANGUAGE plpgsql AS $fn$
DECLARE
    v_next uuid;
BEGIN
    UPDATE tickets_ticket t SET needs_dispatch = false
    WHERE t.id = (
        SELECT w.id FROM tickets_ticket w
        WHERE w.endpoint_id = p_endpoint AND w.state = 'queued' AND w.needs_dispatch
          AND (SELECT e.paused_at FROM endpoints_endpoint e WHERE e.id = p_endpoint) IS NULL
        ORDER BY w.id LIMIT 1)
    RETURNING t.id INTO v_next;
    RETURN v_next;
END
$fn$;
