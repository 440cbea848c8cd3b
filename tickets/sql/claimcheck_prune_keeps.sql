-- The retention rule, once: whether a ticket of the trace keeps it (the
-- prune deletes a trace whole, or not at all: claimcheck_prune_ledger). A
-- ticket keeps its trace unless
--   1. it finished before the cutoff with nothing still owed;
--   2. no owner holds it (tickets_retentionhold: a recovery case or a
--      re-run decision points at it, recovery/sql/claimcheck_recovery_hold.sql);
--   3. it has no live turn, no held lock and no recent history;
--   4. it has no link to a ticket of another trace, either way.
-- Called once per candidate trace: a function whose body holds a sub-select
-- is never inlined, so the rule stays a subplan of its trace (never an
-- anti-join over the whole ticket table) and a batch reads the tickets of
-- the traces it looks at. PL/pgSQL: its plan is kept for the session. Run
-- inside the prune, with the prune's owner and search_path; reads only.
CREATE OR REPLACE FUNCTION claimcheck_prune_keeps(
    p_trace varchar, p_cutoff timestamptz, p_keep_history integer
) RETURNS boolean LANGUAGE plpgsql STABLE
-- Costed above a sub-select of one index probe: a candidate's cheaper tests
-- (its age, a root's missing trace row) come first.
COST 10000
AS $fn$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM tickets_ticket t
         WHERE t.trace_id = p_trace
           AND (
               -- 1. finished before the cutoff, nothing still owed
               t.state NOT IN ('succeeded', 'failed', 'cancelled', 'orphaned')
               OR t.finished_at IS NULL OR t.finished_at >= p_cutoff
               OR t.obligation_state = 'open'
               OR t.callback_state = 'pending'
               OR EXISTS (SELECT 1 FROM tickets_delivery d
                           WHERE d.ticket_id = t.id AND d.next_attempt_at IS NOT NULL)
               -- 2. held by an owner above the ledger
               OR EXISTS (SELECT 1 FROM tickets_retentionhold h WHERE h.ticket_id = t.id)
               -- 3. a live turn, a held lock, recent history
               OR EXISTS (SELECT 1 FROM runtime_turn u
                           WHERE u.ticket_id = t.id
                             AND u.state IN ('running', 'interrupting'))
               OR EXISTS (SELECT 1 FROM runtime_endpointlock l
                            JOIN runtime_turn u ON u.id = l.holder_id
                           WHERE u.ticket_id = t.id)
               OR EXISTS (
                   SELECT 1 FROM runtime_contextentry ce
                    WHERE ce.ticket_id = t.id
                      AND ce.seq >= coalesce((
                          SELECT c2.seq FROM runtime_contextentry c2
                           WHERE c2.endpoint_id = ce.endpoint_id
                           ORDER BY c2.seq DESC OFFSET p_keep_history - 1 LIMIT 1), 0))
               -- 4. links to another trace, either way
               OR EXISTS (SELECT 1 FROM tickets_ticket y
                           WHERE y.id IN (t.parent_id, t.rerun_of_id, t.callback_for_id)
                             AND y.trace_id <> p_trace)
               OR EXISTS (SELECT 1 FROM tickets_ticket x
                           WHERE (x.parent_id = t.id OR x.rerun_of_id = t.id
                                  OR x.callback_for_id = t.id)
                             AND x.trace_id <> p_trace)
               OR EXISTS (SELECT 1 FROM runtime_turn u
                            JOIN tickets_ticket y ON y.id = u.ticket_id
                           WHERE u.id = t.completed_by_turn_id AND y.trace_id <> p_trace)
           )
    );
END
$fn$;
