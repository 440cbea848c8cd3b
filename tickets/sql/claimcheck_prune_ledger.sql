-- The prune's unit is the trace; its candidates are the trace rows and the
-- traces a root opened alone (a lean admission writes no trace row until a
-- second ticket joins: claimcheck_admit_v2), by the same rule.
-- Retention's one privileged path (tickets/retention.py): a SECURITY
-- DEFINER function owned by the owner role that installs it; the
-- application role may EXECUTE it (core/db_roles.py) and nothing more. The
-- rule is re-checked here; the caller chooses only the cutoff (at least a
-- day ago) and the batch size.
CREATE OR REPLACE FUNCTION claimcheck_prune_ledger(
    cutoff timestamptz, max_traces integer, dry_run boolean, keep_history integer
) RETURNS TABLE (
    traces bigint, tickets bigint, events bigint, turns bigint, context_entries bigint,
    callbacks bigint, deliveries bigint, attempts bigint
)
LANGUAGE plpgsql SECURITY DEFINER
AS $fn$
DECLARE
    trace_ids varchar[];
    alone_ids varchar[];
    ticket_ids uuid[];
    turn_ids uuid[];
    delivery_ids uuid[];
BEGIN
    IF cutoff IS NULL OR cutoff > pg_catalog.now() - interval '1 day' THEN
        RAISE EXCEPTION 'prune: the cutoff must be at least one day ago'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_traces IS NULL OR max_traces < 1 THEN
        RAISE EXCEPTION 'prune: max_traces must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF keep_history IS NULL OR keep_history < 1 THEN
        RAISE EXCEPTION 'prune: keep_history must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The candidates, one trace at a time: the rule
    -- (claimcheck_prune_keeps) is a call per trace, so a batch reads the
    -- tickets of the traces it looks at and stops at max_traces. Each
    -- candidate's row is locked; a trace an admission is joining right now
    -- (it holds the row: the trace's count) is skipped.
    SELECT coalesce(array_agg(c.id), '{}') INTO trace_ids FROM (
        SELECT tr.id FROM tickets_trace tr
         WHERE tr.created_at < cutoff
           AND NOT claimcheck_prune_keeps(
               p_trace => tr.id, p_cutoff => cutoff, p_keep_history => keep_history)
         LIMIT max_traces
         FOR UPDATE SKIP LOCKED
    ) c;
    -- Then the traces a root opened alone, which have no row (admission
    -- writes one when a second ticket joins: claimcheck_admit_v2), oldest
    -- first by the same rule. The root's own row is locked: an admission
    -- joining its trace holds it FOR KEY SHARE (claimcheck_admit_breaker, a
    -- child's foreign key), so a trace being joined is skipped here too.
    IF pg_catalog.cardinality(trace_ids) < max_traces THEN
        SELECT coalesce(array_agg(c.trace_id), '{}') INTO alone_ids FROM (
            SELECT r.trace_id FROM tickets_ticket r
             WHERE r.created_at < cutoff AND r.parent_id IS NULL AND r.rerun_of_id IS NULL
               AND r.trace_id = pg_catalog.replace(r.id::text, '-', '')
               AND NOT EXISTS (SELECT 1 FROM tickets_trace tr WHERE tr.id = r.trace_id)
               AND NOT claimcheck_prune_keeps(
                   p_trace => r.trace_id, p_cutoff => cutoff, p_keep_history => keep_history)
             ORDER BY r.id
             LIMIT max_traces - pg_catalog.cardinality(trace_ids)
             FOR UPDATE OF r SKIP LOCKED
        ) c;
        trace_ids := trace_ids || alone_ids;
    END IF;
    -- A ticket that joined a candidate after this statement's snapshot and
    -- before its lock (it committed in between) is not terminal: its trace
    -- stays.
    trace_ids := ARRAY(
        SELECT x FROM pg_catalog.unnest(trace_ids) x
         WHERE NOT EXISTS (
             SELECT 1 FROM tickets_ticket t
              WHERE t.trace_id = x
                AND (t.state NOT IN ('succeeded', 'failed', 'cancelled', 'orphaned')
                     OR t.finished_at IS NULL OR t.finished_at >= cutoff)));

    SELECT coalesce(array_agg(t.id), '{}') INTO ticket_ids
      FROM tickets_ticket t WHERE t.trace_id = ANY(trace_ids);
    SELECT coalesce(array_agg(u.id), '{}') INTO turn_ids
      FROM runtime_turn u WHERE u.ticket_id = ANY(ticket_ids);
    SELECT coalesce(array_agg(d.id), '{}') INTO delivery_ids
      FROM tickets_delivery d WHERE d.ticket_id = ANY(ticket_ids);

    traces := pg_catalog.cardinality(trace_ids);
    tickets := pg_catalog.cardinality(ticket_ids);
    turns := pg_catalog.cardinality(turn_ids);
    deliveries := pg_catalog.cardinality(delivery_ids);
    IF dry_run THEN
        SELECT count(*) INTO events FROM tickets_ticketevent e WHERE e.ticket_id = ANY(ticket_ids);
        SELECT count(*) INTO context_entries FROM runtime_contextentry ce
         WHERE ce.ticket_id = ANY(ticket_ids) OR ce.turn_id = ANY(turn_ids);
        SELECT count(*) INTO callbacks FROM tickets_callback cb
         WHERE cb.source_id = ANY(ticket_ids) OR cb.ticket_id = ANY(ticket_ids);
        SELECT count(*) INTO attempts FROM tickets_deliveryattempt a
         WHERE a.delivery_id = ANY(delivery_ids);
        RETURN NEXT;
        RETURN;
    END IF;

    -- The append-only triggers let these DELETEs through: this transaction,
    -- this function's owner (core/append_only.py).
    PERFORM pg_catalog.set_config('claimcheck.pruning', 'on', true);
    DELETE FROM tickets_deliveryattempt a WHERE a.delivery_id = ANY(delivery_ids);
    GET DIAGNOSTICS attempts = ROW_COUNT;
    DELETE FROM tickets_delivery d WHERE d.id = ANY(delivery_ids);
    DELETE FROM tickets_callback cb
     WHERE cb.source_id = ANY(ticket_ids) OR cb.ticket_id = ANY(ticket_ids);
    GET DIAGNOSTICS callbacks = ROW_COUNT;
    DELETE FROM tickets_ticketevent e WHERE e.ticket_id = ANY(ticket_ids);
    GET DIAGNOSTICS events = ROW_COUNT;
    DELETE FROM runtime_contextentry ce
     WHERE ce.ticket_id = ANY(ticket_ids) OR ce.turn_id = ANY(turn_ids);
    GET DIAGNOSTICS context_entries = ROW_COUNT;
    -- Tickets and turns point at each other; the foreign keys are checked
    -- at commit (DEFERRABLE INITIALLY DEFERRED), when both are gone.
    DELETE FROM tickets_ticket t WHERE t.id = ANY(ticket_ids);
    DELETE FROM runtime_turn u WHERE u.id = ANY(turn_ids);
    DELETE FROM tickets_trace tr WHERE tr.id = ANY(trace_ids);
    PERFORM pg_catalog.set_config('claimcheck.pruning', 'off', true);
    RETURN NEXT;
END;
$fn$;
-- Its search_path pinned to the schema it was installed in, pg_catalog
-- first and pg_temp last: a caller's temporary objects never stand in for
-- the ledger's.
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION claimcheck_prune_ledger(timestamptz, integer, boolean, integer) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END
$do$;
REVOKE ALL ON FUNCTION claimcheck_prune_ledger(timestamptz, integer, boolean, integer) FROM PUBLIC;
