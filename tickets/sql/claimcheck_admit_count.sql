-- Admission's duty for a ticket that joined a trace (claimcheck_admit_v2):
-- its count on the trace, all tickets and its party's, and the trace's
-- depth. The trace's first row, when a root opened it alone
-- (claimcheck_trace_opener), counts that root too and starts at its
-- admission (the wall-clock budget's start). Past the soft limit (a
-- party's count, as the hard one) the trace is flagged once, with a
-- warning event on the ticket that passed it: true then.
CREATE OR REPLACE FUNCTION claimcheck_admit_count(
    p_trace text, p_party text, p_depth integer, p_ticket uuid, p_now timestamptz,
    p_soft integer
) RETURNS boolean LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_first text;
    v_first_at timestamptz;
    v_party_count integer;
    v_flagged boolean;
BEGIN
    SELECT o.o_party, o.o_created_at INTO v_first, v_first_at
    FROM claimcheck_trace_opener(p_trace => p_trace) o;
    INSERT INTO tickets_trace AS tr (id, tickets, parties, max_depth, flagged, created_at)
    VALUES (p_trace, CASE WHEN v_first IS NULL THEN 1 ELSE 2 END,
        CASE WHEN v_first IS NULL THEN jsonb_build_object(p_party, 1)
             WHEN v_first = p_party THEN jsonb_build_object(p_party, 2)
             ELSE jsonb_build_object(v_first, 1, p_party, 1) END,
        p_depth, false, COALESCE(v_first_at, p_now))
    ON CONFLICT (id) DO UPDATE
    SET tickets = tr.tickets + 1,
        parties = tr.parties || jsonb_build_object(p_party,
            COALESCE((tr.parties ->> p_party)::integer, 0) + 1),
        max_depth = greatest(tr.max_depth, EXCLUDED.max_depth)
    RETURNING (tr.parties ->> p_party)::integer, tr.flagged
    INTO v_party_count, v_flagged;
    IF v_party_count > p_soft AND NOT v_flagged THEN
        UPDATE tickets_trace SET flagged = true WHERE id = p_trace;
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
        VALUES (p_ticket, 'trace_soft_limit', '', '', 'circuit-breaker',
            jsonb_build_object('trace_id', p_trace, 'tickets', v_party_count,
                'soft_limit', p_soft),
            p_now);
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;
