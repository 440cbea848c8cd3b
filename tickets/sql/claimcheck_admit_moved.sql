-- Admission's step 0 (claimcheck_admit_v2): a key admitted through an alias
-- before its route moved (docs/explanation/design.md, "Routes that move") is
-- the ticket it named, on whichever endpoint the alias pointed to then.
-- The caller holds the alias row FOR SHARE while it commits: a move (an
-- UPDATE of that row) waits for it, and an admission after the move reads,
-- in this statement's snapshot, every ticket admitted before it. The alias
-- row is locked alone, not through a join here: locked through a join, a
-- row that a move updated while the caller waited was re-checked against
-- the endpoint the join first read (the old one), failed, and went
-- unlocked, and the key was admitted again on the new endpoint.
--
-- No row when the key names nothing moved, or when the caller may not
-- submit to the alias's endpoint as restricted (the caller's step 1 then
-- answers "restricted"). One SELECT, STABLE: inlined into the caller's plan.
CREATE OR REPLACE FUNCTION claimcheck_admit_moved(
    p_address text, p_dedupe_key text, p_may_submit_restricted boolean, p_submitted_by integer
) RETURNS TABLE (
    o_status text, o_ticket uuid, o_endpoint bigint, o_address text, o_return_to bigint,
    o_trace text, o_depth integer, o_root boolean, o_owned boolean, o_turn_seq bigint,
    o_turn_state text, o_return_to_address text, o_row jsonb
) LANGUAGE sql STABLE AS $fn$
    SELECT 'existing'::text, t.id, e.id, e.address::text, t.return_to_id,
        t.trace_id::text, t.depth, false,
        COALESCE(claimcheck_ticket_visible(p_submitted_by => t.submitted_by_id,
            p_endpoint => t.endpoint_id, p_user => p_submitted_by,
            p_owned => CASE WHEN EXISTS (SELECT 1 FROM auth_user_groups ug
                                         WHERE ug.group_id = e.owners_id
                                           AND ug.user_id = p_submitted_by)
                            THEN ARRAY[t.endpoint_id] ELSE '{}'::bigint[] END), false),
        tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
    FROM tickets_ticket t
    JOIN endpoints_endpoint e ON e.id = t.endpoint_id
    LEFT JOIN runtime_turn tu ON tu.id = t.turn_id
    LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
    WHERE t.dedupe_key = p_dedupe_key
      AND (p_may_submit_restricted
           OR EXISTS (SELECT 1 FROM endpoints_endpointalias a
                      JOIN endpoints_endpoint ae ON ae.id = a.endpoint_id
                      WHERE a.alias = p_address AND NOT ae.submit_restricted))
      AND EXISTS (SELECT 1 FROM endpoints_routegeneration r
                  WHERE r.alias = p_address AND r.number > 1)
      AND t.endpoint_id IN (SELECT r.endpoint_id FROM endpoints_routegeneration r
                            WHERE r.alias = p_address AND r.endpoint_id IS NOT NULL)
    ORDER BY t.id LIMIT 1
$fn$;
