CREATE OR REPLACE FUNCTION claimcheck_admit(
    p_id uuid, p_address text, p_dedupe_key text, p_sha text, p_input jsonb,
    p_parent uuid, p_trace text, p_return_to text, p_continuation jsonb, p_requester jsonb,
    p_callback_for uuid, p_rerun_of uuid, p_submitted_by integer, p_may_submit_restricted boolean,
    p_actor text, p_now timestamptz, p_due timestamptz, p_soft integer, p_hard integer
) RETURNS TABLE (
    o_status text, o_ticket uuid, o_endpoint bigint, o_address text, o_return_to bigint,
    o_trace text, o_depth integer, o_root boolean, o_owned boolean, o_turn_seq bigint,
    o_turn_state text, o_return_to_address text, o_row jsonb
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    e endpoints_endpoint;
    rt endpoints_endpoint;
    v_trace text;
    v_count integer;
    v_flagged boolean;
    v_refusal text;
BEGIN
    -- 0. A route that moved (docs/design.md, "Routes that move"): a key
    --    admitted through an alias before it moved is the ticket it named,
    --    on whichever endpoint the alias pointed to then. FOR SHARE holds
    --    the alias while this admission commits: a move (an UPDATE of the
    --    row) waits for it, and an admission after the move reads, in the
    --    next statement's snapshot, every ticket admitted before it.
    IF p_dedupe_key IS NOT NULL THEN
        PERFORM 1 FROM endpoints_endpointalias a
        JOIN endpoints_endpoint ae ON ae.id = a.endpoint_id
        WHERE a.alias = p_address AND (p_may_submit_restricted OR NOT ae.submit_restricted)
        FOR SHARE OF a;
    END IF;
    IF p_dedupe_key IS NOT NULL AND FOUND THEN
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address::text, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        JOIN endpoints_endpoint e ON e.id = t.endpoint_id
        LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
        LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
        WHERE t.dedupe_key = p_dedupe_key
          AND EXISTS (SELECT 1 FROM endpoints_routegeneration r
                      WHERE r.alias = p_address AND r.number > 1)
          AND t.endpoint_id IN (SELECT r.endpoint_id FROM endpoints_routegeneration r
                                WHERE r.alias = p_address AND r.endpoint_id IS NOT NULL)
        ORDER BY t.id LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;

    -- 1. One statement: every guard of a new ticket, and the writes (the
    --    ticket, its event, its count on the trace, the dispatcher's wake-up
    --    at commit); or, when the key is taken, the ticket holding it, whole,
    --    whatever would refuse a new one (the caller compares the input hash
    --    and decides who may see it). The guards: the endpoint (address or
    --    alias) and the return_to exist and, when restricted, the caller has
    --    asked the directory (``p_may_submit_restricted``); the endpoint is
    --    available (quarantine fails closed); a busy or paused "reject"
    --    endpoint takes nothing (a paused "enqueue" one queues it; a re-run
    --    is an owner's decision, not new work, and queues); a child's
    --    parent exists and is on the trace given; the trace is under its
    --    hard limit, its row locked so admissions to one trace queue here
    --    (a new root trace has no row yet). The ledger is the outbox: the
    --    ticket owes a dispatch (needs_dispatch), no broker round trip here.
    WITH ea AS (
        SELECT e.id, e.address, e.owners_id, e.state, e.busy_policy, e.submit_restricted,
            e.paused_at
        FROM endpoints_endpoint e
        WHERE e.id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_address),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_address))
          AND (p_may_submit_restricted OR NOT e.submit_restricted)
    ),
    rt AS (
        SELECT e.id, e.address FROM endpoints_endpoint e
        WHERE p_return_to IS NOT NULL AND e.id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_return_to),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_return_to))
          AND (p_may_submit_restricted OR NOT e.submit_restricted)
    ),
    pa AS (
        SELECT t.trace_id, t.depth + 1 AS depth FROM tickets_ticket t WHERE t.id = p_parent
    ),
    tv AS (
        SELECT COALESCE((SELECT trace_id FROM pa), p_trace, replace(p_id::text, '-', '')) AS id,
            COALESCE((SELECT depth FROM pa), 0) AS depth,
            p_parent IS NULL OR (p_rerun_of IS NOT NULL AND EXISTS (
                SELECT 1 FROM tickets_ticket o
                WHERE o.id = p_rerun_of AND o.obligation_state <> 'none')) AS root
    ),
    tl AS (
        SELECT tr.tickets FROM tickets_trace tr
        WHERE (p_trace IS NOT NULL OR p_parent IS NOT NULL) AND tr.id = (SELECT id FROM tv)
        FOR UPDATE
    ),
    ep AS (
        SELECT ea.id, ea.address, ea.owners_id FROM ea
        WHERE ea.state = 'available'
          AND (p_return_to IS NULL OR EXISTS (SELECT 1 FROM rt))
          AND (p_parent IS NULL OR EXISTS (
                SELECT 1 FROM pa WHERE p_trace IS NULL OR pa.trace_id = p_trace))
          AND (p_rerun_of IS NOT NULL OR ea.busy_policy = 'enqueue' OR (
                ea.paused_at IS NULL AND NOT EXISTS (SELECT 1 FROM endpoints_endpointlock l
                            WHERE l.endpoint_id = ea.id AND l.holder_id IS NOT NULL)
                AND NOT EXISTS (SELECT 1 FROM tickets_ticket q
                                WHERE q.endpoint_id = ea.id AND q.state = 'queued')))
          AND COALESCE((SELECT tickets FROM tl), 0) < p_hard
    ),
    ins AS (
        INSERT INTO tickets_ticket (
            id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
            artifacts, return_to_id, continuation, callback_for_id, rerun_of_id, requester,
            submitted_by_id, callback_state, delivery_state, needs_dispatch, obligation_state,
            obligation_due_at, obligation_overdue, obligation_note, created_at, updated_at,
            version)
        SELECT p_id, ep.id, p_dedupe_key, p_sha, p_input, p_parent, tv.id, tv.depth, 'queued',
            '[]'::jsonb, (SELECT id FROM rt), p_continuation, p_callback_for, p_rerun_of,
            p_requester, p_submitted_by,
            CASE WHEN p_return_to IS NOT NULL THEN 'pending' ELSE 'none' END, 'none', true,
            CASE WHEN tv.root THEN 'open' ELSE 'none' END, CASE WHEN tv.root THEN p_due END,
            false, '', p_now, p_now, 1
        FROM ep, tv
        ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
        RETURNING id, pg_notify('claimcheck_dispatch', '') IS NULL AS woke
    ),
    ev AS (
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
        SELECT id, 'admitted', '', 'queued', p_actor,
            CASE WHEN p_parent IS NOT NULL THEN jsonb_build_object('parent', p_parent::text)
                 ELSE '{}'::jsonb END, p_now
        FROM ins
    ),
    tr AS (
        INSERT INTO tickets_trace AS tr (id, tickets, max_depth, flagged, created_at)
        SELECT tv.id, 1, tv.depth, false, p_now FROM ins, tv
        ON CONFLICT (id) DO UPDATE
        SET tickets = tr.tickets + 1, max_depth = greatest(tr.max_depth, EXCLUDED.max_depth)
        RETURNING tr.tickets, tr.flagged
    )
    SELECT 'admitted', ins.id, ea.id, ea.address::text, (SELECT id FROM rt), tv.id, tv.depth,
        tv.root, false, NULL::bigint, NULL::text, (SELECT address::text FROM rt), NULL::jsonb,
        tr.tickets, tr.flagged
    FROM ins, ea, tv, tr
    UNION ALL
    -- Not inserted: the ticket that holds the key (committed before this
    -- statement began; a racing one is read again below), with what its
    -- payload and the visibility check need.
    SELECT 'existing', t.id, ea.id, ea.address::text, t.return_to_id, t.trace_id::text, t.depth,
        false,
        EXISTS (SELECT 1 FROM auth_user_groups ug
                WHERE ug.group_id = ea.owners_id AND ug.user_id = p_submitted_by),
        tu.seq, tu.state::text, rte.address::text, to_jsonb(t), NULL::integer, NULL::boolean
    FROM tickets_ticket t JOIN ea ON t.endpoint_id = ea.id
    LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
    LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
    WHERE t.dedupe_key = p_dedupe_key AND NOT EXISTS (SELECT 1 FROM ins)
      AND (p_return_to IS NULL OR EXISTS (SELECT 1 FROM rt))
    INTO o_status, o_ticket, o_endpoint, o_address, o_return_to, o_trace, o_depth, o_root,
        o_owned, o_turn_seq, o_turn_state, o_return_to_address, o_row, v_count, v_flagged;
    IF o_status = 'admitted' THEN
        -- Past the soft limit the trace is flagged once, with a warning on
        -- the ticket that passed it.
        IF v_count > p_soft AND NOT v_flagged THEN
            UPDATE tickets_trace SET flagged = true WHERE id = o_trace;
            INSERT INTO tickets_ticketevent (
                ticket_id, kind, from_state, to_state, actor, detail, at)
            VALUES (p_id, 'trace_soft_limit', '', '', 'circuit-breaker',
                jsonb_build_object('trace_id', o_trace, 'tickets', v_count, 'soft_limit', p_soft),
                p_now);
            o_status := 'admitted_flagged';
        END IF;
        RETURN NEXT;
        RETURN;
    ELSIF o_status IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- 2. Nothing written: why (reads only, each with a new snapshot).
    SELECT * INTO e FROM endpoints_endpoint WHERE id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = p_address),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_address));
    IF e.id IS NULL THEN
        RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_address,
            NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
            NULL::jsonb;
        RETURN;
    END IF;
    IF p_return_to IS NOT NULL THEN
        SELECT * INTO rt FROM endpoints_endpoint WHERE id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_return_to),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_return_to));
        IF rt.id IS NULL THEN
            RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_return_to,
                NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
                NULL::jsonb;
            RETURN;
        END IF;
    END IF;
    -- A restricted endpoint (or return_to): the caller asks the directory who
    -- may submit (endpoints.selectors.may_submit) before anything is looked
    -- up, then calls again.
    IF NOT p_may_submit_restricted AND (e.submit_restricted OR rt.submit_restricted) THEN
        RETURN QUERY SELECT 'restricted', NULL::uuid, e.id, e.address::text, rt.id, NULL::text,
            0, false, false, NULL::bigint, NULL::text, rt.address::text, jsonb_build_array(
                jsonb_build_object('id', e.id, 'address', e.address,
                    'submit_restricted', e.submit_restricted, 'owners_id', e.owners_id),
                CASE WHEN rt.id IS NOT NULL THEN jsonb_build_object('id', rt.id,
                    'address', rt.address, 'submit_restricted', rt.submit_restricted,
                    'owners_id', rt.owners_id) END);
        RETURN;
    END IF;
    -- A winner that committed while the statement above waited for it.
    IF p_dedupe_key IS NOT NULL THEN
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address::text, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
        LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
        WHERE t.endpoint_id = e.id AND t.dedupe_key = p_dedupe_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF p_parent IS NOT NULL THEN
        SELECT t.trace_id INTO v_trace FROM tickets_ticket t WHERE t.id = p_parent;
        IF NOT FOUND THEN
            v_refusal := 'parent_not_found';
        ELSIF p_trace IS NOT NULL AND p_trace <> v_trace THEN
            v_refusal := 'trace_mismatch';
        END IF;
    END IF;
    IF v_refusal IS NULL AND e.state <> 'available' THEN
        v_refusal := 'quarantined';
    END IF;
    IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy <> 'enqueue'
            AND e.paused_at IS NOT NULL THEN
        v_refusal := 'paused';
    END IF;
    IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy <> 'enqueue' AND (
            EXISTS (SELECT 1 FROM endpoints_endpointlock l
                    WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL)
            OR EXISTS (SELECT 1 FROM tickets_ticket q
                       WHERE q.endpoint_id = e.id AND q.state = 'queued')) THEN
        v_refusal := 'busy';
    END IF;
    v_trace := COALESCE(v_trace, p_trace);
    IF v_refusal IS NULL AND v_trace IS NOT NULL AND COALESCE(
            (SELECT tr.tickets FROM tickets_trace tr WHERE tr.id = v_trace), 0) >= p_hard THEN
        v_refusal := 'circuit_open';
    END IF;
    -- None holds now: what refused it a moment ago has changed; the caller
    -- may call again.
    RETURN QUERY SELECT COALESCE(v_refusal, 'retry'), NULL::uuid, e.id, e.address::text,
        NULL::bigint, v_trace, 0, false, false, NULL::bigint, NULL::text, NULL::text,
        NULL::jsonb;
END
$fn$;
