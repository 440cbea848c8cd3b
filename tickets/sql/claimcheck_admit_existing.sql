-- Admission's last step (claimcheck_admit_v2): the ticket that holds the key
-- on the endpoint, in any state, with what its payload and the visibility
-- check need: whether the submitter owns the endpoint, its turn's seq and
-- state, its return_to's address, and the row whole as one JSON value
-- (tickets/admission.py reads it back as the ORM would). The caller
-- compares the input hash and decides who may see it. One SELECT, STABLE:
-- inlined into the caller's plan.
CREATE OR REPLACE FUNCTION claimcheck_admit_existing(
    p_endpoint bigint, p_address text, p_owners integer, p_dedupe_key text,
    p_submitted_by integer
) RETURNS TABLE (
    o_status text, o_ticket uuid, o_endpoint bigint, o_address text, o_return_to bigint,
    o_trace text, o_depth integer, o_root boolean, o_owned boolean, o_turn_seq bigint,
    o_turn_state text, o_return_to_address text, o_row jsonb
) LANGUAGE sql STABLE AS $fn$
    SELECT 'existing'::text, t.id, p_endpoint, p_address, t.return_to_id,
        t.trace_id::text, t.depth, false,
        COALESCE(claimcheck_ticket_visible(p_submitted_by => t.submitted_by_id,
            p_endpoint => t.endpoint_id, p_user => p_submitted_by,
            p_owned => CASE WHEN EXISTS (SELECT 1 FROM auth_user_groups ug
                                         WHERE ug.group_id = p_owners
                                           AND ug.user_id = p_submitted_by)
                            THEN ARRAY[t.endpoint_id] ELSE '{}'::bigint[] END), false),
        tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
    FROM tickets_ticket t
    LEFT JOIN runtime_turn tu ON tu.id = t.turn_id
    LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
    WHERE t.endpoint_id = p_endpoint AND t.dedupe_key = p_dedupe_key
$fn$;
