-- An endpoint on which a turn may start: available (not quarantined) and
-- not paused by its owners. Whether its lock is free is the lock row's to
-- say. Called by the start (claimcheck_start_turn), the dispatcher's pass
-- and sweep, the worker registry's starved endpoints and the audit's
-- stranded tickets; inlined where it is called, so an index on the columns
-- serves the expression.
CREATE OR REPLACE FUNCTION claimcheck_endpoint_may_start(p_state text, p_paused_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT p_state = 'available' AND p_paused_at IS NULL
$fn$;
