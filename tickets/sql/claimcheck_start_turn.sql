CREATE OR REPLACE FUNCTION claimcheck_start_turn(
    p_ticket uuid, p_turn uuid, p_task text, p_worker jsonb, p_token_sha256 text,
    p_actor text, p_node text, p_pid integer
) RETURNS TABLE (o_endpoint endpoints_endpoint, o_turn runtime_turn, o_ticket tickets_ticket)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
-- A ticket is found by its key alone, or by its key and endpoint: with
-- "state = 'queued'" beside a bare id the planner may take the queued
-- tickets' index (endpoint_id, id), where id is not the first column, and
-- read the whole index (every endpoint's queue, and the entries of tickets
-- started since the last vacuum) on every start. So msg reads the row by
-- its primary key (MATERIALIZED: the state is checked outside), and the
-- updates below name the endpoint too.
WITH msg AS MATERIALIZED (
    SELECT t.endpoint_id, t.state FROM tickets_ticket t WHERE t.id = p_ticket
),
lk AS (
    SELECT l.endpoint_id, l.holder_id FROM runtime_endpointlock l
    WHERE l.endpoint_id = (SELECT endpoint_id FROM msg WHERE state = 'queued')
    FOR UPDATE
),
tk AS (
    SELECT t.id, t.budget_s FROM tickets_ticket t
    WHERE t.endpoint_id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      AND t.state = 'queued'
    ORDER BY t.id LIMIT 1
    FOR UPDATE SKIP LOCKED
),
ep AS (
    UPDATE endpoints_endpoint e SET turn_seq = e.turn_seq + 1
    WHERE e.id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      -- Paused: nothing new starts. A pause committed while this statement
      -- waited for the row is seen here (an UPDATE re-tests its row's latest
      -- version): the start or the pause, one of them first, never both.
      AND claimcheck_endpoint_may_start(p_state => e.state, p_paused_at => e.paused_at)
      AND EXISTS (SELECT 1 FROM tk)
    -- The clock is read once the lock row is ours: the turn lies inside its tenure.
    RETURNING e AS row, e.id, e.turn_seq, e.runner, e.turn_budget_s, clock_timestamp() AS now
),
tn AS (
    INSERT INTO runtime_turn AS u (
        id, endpoint_id, ticket_id, seq, state, runner_kind, celery_task_id, worker,
        started_at, heartbeat_at, deadline_at, interrupt_requested_at, interrupt_reason,
        ended_at, stop_evidence, token_sha256, generation, slot)
    SELECT p_turn, ep.id, tk.id, ep.turn_seq, 'running', COALESCE(ep.runner->>'kind', ''),
        p_task, p_worker, ep.now, ep.now,
        ep.now + make_interval(secs => LEAST(ep.turn_budget_s, COALESCE(tk.budget_s, ep.turn_budget_s))), NULL, '', NULL, NULL, p_token_sha256,
        (ep.row).generation,
        -- The worker pool process that runs it (tickets/turns/slots.py), on
        -- the turn's own row: the worker registry reads it there. None
        -- outside a worker.
        CASE WHEN p_node <> '' THEN p_node || ':' || p_pid END
    FROM ep, tk
    RETURNING u AS row, u.id, u.seq, u.ticket_id, u.endpoint_id, u.started_at
),
-- No "holder_id IS NULL" here: an UPDATE tests its WHERE on the row as the
-- statement's snapshot saw it, which may still show the holder that released
-- the lock while lk waited. lk has the row locked and saw it free.
-- The rows are found by key through uncorrelated sub-selects of tn, never
-- joined to it: as a join the planner (estimating one queued ticket) scanned
-- the endpoint's whole queued index for the ticket, O(backlog) per start.
hold AS (
    UPDATE runtime_endpointlock l SET holder_id = u.id, token = u.seq, acquired_at = u.started_at
    FROM tn u WHERE l.endpoint_id = (SELECT endpoint_id FROM tn)
),
tu AS (
    UPDATE tickets_ticket t
    SET state = 'running', turn_id = u.id, updated_at = u.started_at
    FROM tn u WHERE t.id = (SELECT ticket_id FROM tn)
      AND t.endpoint_id = (SELECT endpoint_id FROM tn) AND t.state = 'queued'
    RETURNING t AS row, t.id
),
ev AS (
    INSERT INTO tickets_ticketevent (
        ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
    SELECT t.id, 'turn_started', 'queued', 'running', p_actor, u.id,
        jsonb_build_object('seq', u.seq), u.started_at
    FROM tu t, tn u
),
-- The message was used up without starting its ticket: the next release
-- publishes it (lock held, endpoint not available or paused, or an older
-- ticket first).
mk AS (
    UPDATE tickets_ticket t SET needs_dispatch = true
    WHERE t.id = p_ticket AND t.endpoint_id = (SELECT endpoint_id FROM lk) AND t.state = 'queued'
      AND EXISTS (SELECT 1 FROM lk)
      AND (EXISTS (SELECT 1 FROM lk WHERE holder_id IS NOT NULL)
           OR (EXISTS (SELECT 1 FROM tk)
               AND NOT EXISTS (SELECT 1 FROM tn WHERE tn.ticket_id = p_ticket)))
)
SELECT ep.row, u.row, t.row FROM ep, tn u, tu t;
END
$fn$;
