-- The root that opened a trace alone, when the trace has no row yet: a
-- ticket admitted with no trace given, no parent and no re-run is its own
-- trace (the trace id is its id without dashes) and writes no trace row
-- (claimcheck_admit_v2). When a second ticket joins the trace, its count
-- starts with this one (claimcheck_admit_breaker, claimcheck_admit_count,
-- tickets/budgets.py open_budget). Its party is its submitter's id, or "-"
-- (docs/reference/api.md, "A trace's breaker counts per party").
--
-- No row when the trace has a row, or was not opened that way. One SELECT,
-- STABLE: inlined into the caller's plan.
CREATE OR REPLACE FUNCTION claimcheck_trace_opener(p_trace text)
RETURNS TABLE (o_ticket uuid, o_party text, o_created_at timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT t.id, COALESCE(t.submitted_by_id::text, '-'), t.created_at
    FROM tickets_ticket t
    WHERE t.id = CASE WHEN p_trace ~ '^[0-9a-f]{32}$' THEN p_trace::uuid END
      AND t.trace_id = p_trace AND t.parent_id IS NULL AND t.rerun_of_id IS NULL
      AND NOT EXISTS (SELECT 1 FROM tickets_trace tr WHERE tr.id = p_trace)
$fn$;
