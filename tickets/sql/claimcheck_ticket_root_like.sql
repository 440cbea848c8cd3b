-- A ticket that answers a requester: a root, or a re-run that carries its
-- original's obligation. Its terminal state opens its delivery
-- (claimcheck_ticket_owes, for every move of a ticket: a turn's finish and
-- claimcheck_ticket_move); an orphan superseded by a re-run passes its
-- obligation (claimcheck_ticket_move). Inlined where it is called.
CREATE OR REPLACE FUNCTION claimcheck_ticket_root_like(
    p_parent uuid, p_rerun_of uuid, p_obligation_state text
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT p_parent IS NULL OR (p_rerun_of IS NOT NULL AND p_obligation_state <> 'none')
$fn$;
