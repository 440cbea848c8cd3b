-- Admission's guard for a ticket that joins a trace (claimcheck_admit_v2):
-- the trace's budget and its circuit breaker, under the trace row's lock,
-- so admissions to one trace queue here. Answers the refusal (NULL: none)
-- and the party the ticket counts for.
--
-- The breaker counts per party (docs/reference/api.md, "A trace's breaker
-- counts per party"): the submitter, or for the runtime's own admissions (a
-- child, a callback, a re-run) the submitter of the nearest ticket up the
-- parent (else re-run) links that has one; "-" when none has. So whoever
-- else may add to a trace (the owner of an endpoint it reached) spends its
-- own share, not the root's.
--
-- A trace's budget (tickets/budgets.py): spent (``exhausted_at``, set under
-- this same row lock by the service that counts usage, so an admission
-- queued here behind it reads it), or past its wall-clock budget since the
-- root's admission, the trace takes nothing more.
--
-- A trace with no row was opened by a root alone (claimcheck_trace_opener)
-- or is new: that root counts, and its row is held FOR KEY SHARE instead,
-- so the prune (claimcheck_prune_ledger), which locks such a root FOR
-- UPDATE SKIP LOCKED, skips a trace being joined, as it skips a locked
-- trace row.
CREATE OR REPLACE FUNCTION claimcheck_admit_breaker(
    p_trace text, p_submitted_by integer, p_parent uuid, p_rerun_of uuid,
    p_now timestamptz, p_hard integer
) RETURNS TABLE (o_refusal text, o_party text) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_party text := p_submitted_by::text;
    v_held integer;
    v_spent boolean;
    v_first uuid;
BEGIN
    IF v_party IS NULL AND COALESCE(p_parent, p_rerun_of) IS NOT NULL THEN
        WITH RECURSIVE up (submitted_by, next, n) AS (
            SELECT t.submitted_by_id, COALESCE(t.parent_id, t.rerun_of_id), 1
            FROM tickets_ticket t WHERE t.id = COALESCE(p_parent, p_rerun_of)
            UNION ALL
            SELECT t.submitted_by_id, COALESCE(t.parent_id, t.rerun_of_id), up.n + 1
            FROM up JOIN tickets_ticket t ON t.id = up.next
            WHERE up.submitted_by IS NULL AND up.n < 1000)
        SELECT up.submitted_by::text INTO v_party
        FROM up WHERE up.submitted_by IS NOT NULL LIMIT 1;
    END IF;
    v_party := COALESCE(v_party, '-');
    SELECT COALESCE((tr.parties ->> v_party)::integer, 0),
        tr.exhausted_at IS NOT NULL OR COALESCE(tr.created_at + make_interval(
            secs => (tr.budget ->> 'wall_s')::float8) <= p_now, false)
    INTO v_held, v_spent
    FROM tickets_trace tr WHERE tr.id = p_trace FOR UPDATE;
    IF NOT FOUND THEN
        SELECT (o.o_party = v_party)::integer, o.o_ticket INTO v_held, v_first
        FROM claimcheck_trace_opener(p_trace => p_trace) o;
        IF v_first IS NOT NULL THEN
            PERFORM 1 FROM tickets_ticket t WHERE t.id = v_first FOR KEY SHARE;
        END IF;
    END IF;
    IF v_spent THEN
        o_refusal := 'trace_budget_exhausted';
    ELSIF COALESCE(v_held, 0) >= p_hard THEN
        o_refusal := 'circuit_open';
    END IF;
    o_party := v_party;
    RETURN NEXT;
END
$fn$;
