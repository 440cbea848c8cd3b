-- A ticket that answers a requester: a root, or a re-run that carries its
-- original's obligation. Its terminal state opens its delivery (the finish
-- of a turn, claimcheck_finish_turn; every other terminal transition,
-- tickets/terminal.py, which reads it through this function). Inlined
-- where it is called.
CREATE OR REPLACE FUNCTION claimcheck_ticket_root_like(
    p_parent uuid, p_rerun_of uuid, p_obligation_state text
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT p_parent IS NULL OR (p_rerun_of IS NOT NULL AND p_obligation_state <> 'none')
$fn$;
