-- A turn's outcome applied, in one transaction, in named parts:
--   1. the rows locked (ticket, lock, turn);
--   2. the guard (claimcheck_finish_guard): the exact turn, or a duplicate
--      of an outcome already recorded, or a stale report (recorded here);
--   3. the decision (claimcheck_finish_outcome): what the outcome makes of
--      the turn and the ticket;
--   4. what the ticket owes before its move (claimcheck_ticket_owes, the
--      part every move of a ticket shares: claimcheck_ticket_move): a
--      terminal ticket that answers a requester opens its delivery,
--      recorded on the transition's event;
--   5. the write (claimcheck_finish_write): turn, context entry, the
--      ticket's move and its event (claimcheck_ticket_write, shared with
--      claimcheck_ticket_move), worker slot;
--   6. the duty owed after it (claimcheck_finish_next): the lock released,
--      the endpoint's next ticket started or returned.
-- The signature and the result are the running release's contract
-- (core/sqlfunctions.py): the parts may change beneath them.
CREATE OR REPLACE FUNCTION claimcheck_finish_turn(
    p_ticket uuid, p_endpoint bigint, p_turn uuid, p_seq bigint,
    p_kind text, p_result jsonb, p_artifacts jsonb, p_error jsonb, p_evidence jsonb,
    p_children jsonb, p_continuation jsonb, p_stale_detail jsonb,
    p_digest text, p_source text, p_ran_s double precision,
    p_delivery uuid, p_node text, p_pid integer,
    p_next_turn uuid, p_task text, p_worker jsonb, p_next_token_sha256 text, p_next_actor text
) RETURNS TABLE (
    o_status text, o_state text, o_turn_state text, o_next uuid, o_delivery uuid,
    o_due boolean, o_reason text,
    o_next_endpoint endpoints_endpoint, o_next_turn runtime_turn, o_next_ticket tickets_ticket
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    t tickets_ticket;
    l runtime_endpointlock;
    u runtime_turn;
    v_rows record;
    v_now timestamptz;
    v_timing jsonb := '{}';
    v_returned_by timestamptz;
    v_guard record;
    v_out record;
    v_detail jsonb;
    v_del_id uuid;
    v_del_state text;
    v_del_due boolean := false;
    v_next record;
BEGIN
    -- 1. Lock ticket, lock row, turn, in that order (every path that takes
    --    more than one of them takes them so), in one statement: a locking
    --    clause locks the rows of each result row in the order of its OF
    --    list, and re-reads the latest version of a row it waited for.
    --    Every endpoint has its lock row: none found is a missing turn.
    SELECT tt AS t, ll AS l, uu AS u INTO v_rows
    FROM tickets_ticket tt, runtime_endpointlock ll, runtime_turn uu
    WHERE tt.id = p_ticket AND ll.endpoint_id = p_endpoint AND uu.id = p_turn
    FOR UPDATE OF tt, ll, uu;
    IF FOUND THEN
        t := v_rows.t; l := v_rows.l; u := v_rows.u;
    END IF;
    IF t.id IS NULL OR u.id IS NULL OR u.ticket_id <> p_ticket OR u.endpoint_id <> p_endpoint THEN
        o_status := 'missing'; o_due := false;
        o_reason := format('turn %s of ticket %s does not exist', p_turn, p_ticket);
        RETURN NEXT;
        RETURN;
    END IF;
    v_now := clock_timestamp();
    IF p_ran_s IS NOT NULL AND p_ran_s >= 0 THEN
        v_returned_by := u.started_at + make_interval(secs => p_ran_s);
        v_timing := jsonb_build_object('ran_s', round(p_ran_s::numeric, 3),
            'returned_by', to_char(v_returned_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'));
    END IF;

    -- 2. The guard.
    SELECT g.o_verdict, g.o_reason INTO v_guard
    FROM claimcheck_finish_guard(p_ticket => t, p_lock => l, p_turn => u,
        p_seq => p_seq, p_digest => p_digest) g;
    IF v_guard.o_verdict = 'duplicate' THEN
        o_status := 'duplicate'; o_state := t.state; o_turn_state := u.state;
        o_due := false; o_reason := '';
        RETURN NEXT;
        RETURN;
    ELSIF v_guard.o_verdict = 'stale' THEN
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
        VALUES (p_ticket, 'stale_outcome', '', '', p_source, u.id,
            jsonb_build_object('seq', p_seq, 'turn_state', u.state, 'outcome', p_kind)
                || p_stale_detail || v_timing, v_now);
        o_status := 'stale'; o_state := t.state; o_turn_state := u.state;
        o_due := false; o_reason := v_guard.o_reason;
        RETURN NEXT;
        RETURN;
    END IF;

    -- 3. The decision.
    SELECT d.* INTO v_out
    FROM claimcheck_finish_outcome(p_ticket => t, p_turn => u, p_kind => p_kind,
        p_result => p_result, p_artifacts => p_artifacts, p_error => p_error,
        p_evidence => p_evidence, p_children => p_children, p_continuation => p_continuation,
        p_digest => p_digest, p_ran_s => p_ran_s, p_timing => v_timing,
        p_returned_by => v_returned_by, p_now => v_now) d;

    -- 4. What the ticket owes before its move (a running ticket is never
    --    superseded by a re-run: nothing passes).
    SELECT w.o_detail, w.o_delivery, w.o_delivery_state, w.o_due
    INTO v_detail, v_del_id, v_del_state, v_del_due
    FROM claimcheck_ticket_owes(p_ticket => t, p_to => v_out.o_to, p_detail => v_out.o_detail,
        p_delivery => p_delivery, p_now => v_now) w;

    -- 5. The write. The ticket row is locked and was checked above: a miss is a bug.
    IF NOT claimcheck_finish_write(p_ticket => t, p_turn => u,
            p_turn_state => v_out.o_turn_state, p_to => v_out.o_to, p_kind => v_out.o_kind,
            p_detail => v_detail, p_error => v_out.o_error, p_result => v_out.o_result,
            p_artifacts => v_out.o_artifacts, p_context => v_out.o_context,
            p_stop_evidence => v_out.o_stop_evidence, p_delivery_state => v_del_state,
            p_actor => 'turn:' || p_seq || ':' || p_source, p_now => v_now,
            p_node => p_node, p_pid => p_pid) THEN
        RAISE EXCEPTION 'ticket % is no longer running', t.id;
    END IF;

    -- 6. The lock released; the next ticket started here or returned.
    SELECT n.* INTO v_next
    FROM claimcheck_finish_next(p_endpoint => p_endpoint, p_turn => u.id,
        p_next_turn => p_next_turn, p_task => p_task, p_worker => p_worker,
        p_next_token_sha256 => p_next_token_sha256, p_next_actor => p_next_actor,
        p_node => p_node, p_pid => p_pid) n;
    o_next_endpoint := v_next.o_next_endpoint;
    o_next_turn := v_next.o_next_turn;
    o_next_ticket := v_next.o_next_ticket;

    o_status := 'finished'; o_state := v_out.o_to; o_turn_state := v_out.o_turn_state;
    o_next := v_next.o_next; o_delivery := v_del_id; o_due := COALESCE(v_del_due, false);
    o_reason := '';
    RETURN NEXT;
END
$fn$;
