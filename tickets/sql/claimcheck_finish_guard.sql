-- The finish's guard: is the reporting turn the ticket's exact turn? It is
-- when ticket.turn, lock.holder and the turn are one, the lock's token, the
-- turn's seq and the reported seq are equal, and the turn is active
-- (running or interrupting). Otherwise the outcome is a 'duplicate' (this
-- very outcome, by its digest, was recorded by an earlier attempt whose
-- reply was lost) or 'stale' (with the reason the caller records). Reads
-- only; the caller holds the three rows.
CREATE OR REPLACE FUNCTION claimcheck_finish_guard(
    p_ticket tickets_ticket, p_lock runtime_endpointlock, p_turn runtime_turn,
    p_seq bigint, p_digest text, OUT o_verdict text, OUT o_reason text
) LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    SELECT
        CASE
            WHEN (p_ticket).turn_id = (p_turn).id AND (p_lock).holder_id = (p_turn).id
                 AND (p_lock).token = (p_turn).seq AND (p_turn).seq = p_seq
                 AND (p_turn).state IN ('running', 'interrupting')
            THEN 'exact'
            WHEN (p_turn).seq = p_seq AND (p_turn).state NOT IN ('running', 'interrupting')
                 AND EXISTS (
                    SELECT 1 FROM tickets_ticketevent ev
                    WHERE ev.ticket_id = (p_ticket).id AND ev.turn_id = (p_turn).id
                      AND ev.detail->>'outcome_sha256' = p_digest)
            THEN 'duplicate'
            ELSE 'stale'
        END,
        CASE
            WHEN (p_turn).state NOT IN ('running', 'interrupting')
                 OR (p_lock).token IS DISTINCT FROM p_seq
            THEN format('turn %s is %s; seq %s vs current %s', (p_turn).id, (p_turn).state,
                        p_seq, COALESCE((p_lock).token::text, 'None'))
            ELSE format('turn %s is not the exact turn of ticket %s', (p_turn).id, (p_ticket).id)
        END
    INTO o_verdict, o_reason;
END
$fn$;
