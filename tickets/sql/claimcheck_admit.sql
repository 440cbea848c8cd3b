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
    e record;
    v_rt bigint;
    v_rt_address text;
    v_rt_owners integer;
    v_rt_restricted boolean := false;
    v_trace text;
    v_depth integer := 0;
    v_root boolean := p_parent IS NULL;
    v_count integer;
    v_party text;
    v_party_count integer;
    v_flagged boolean;
    v_woke boolean;
    v_refusal text;
    v_held integer;
    v_spent boolean;
BEGIN
    -- 0. A route that moved (docs/explanation/design.md, "Routes that move"): a key
    --    admitted through an alias before it moved is the ticket it named,
    --    on whichever endpoint the alias pointed to then. FOR SHARE holds
    --    the alias while this admission commits: a move (an UPDATE of the
    --    row) waits for it, and an admission after the move reads, in the
    --    next statement's snapshot, every ticket admitted before it. The
    --    alias row is locked alone: locked through a join, a row that a move
    --    updated while this waited was re-checked against the endpoint the
    --    join first read (the old one), failed, and went unlocked, and the
    --    key was admitted again on the new endpoint.
    IF p_dedupe_key IS NOT NULL THEN
        PERFORM 1 FROM endpoints_endpointalias a WHERE a.alias = p_address FOR SHARE;
        IF FOUND AND NOT p_may_submit_restricted THEN
            PERFORM 1 FROM endpoints_endpointalias a
            JOIN endpoints_endpoint ae ON ae.id = a.endpoint_id
            WHERE a.alias = p_address AND NOT ae.submit_restricted;
        END IF;
    END IF;
    IF p_dedupe_key IS NOT NULL AND FOUND THEN
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address::text, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        JOIN endpoints_endpoint e ON e.id = t.endpoint_id
        LEFT JOIN runtime_turn tu ON tu.id = t.turn_id
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

    -- Each step is its own small statement, run only when the request needs
    -- it: a root ticket on an "enqueue" endpoint, the common case, costs the
    -- endpoint's lookup and the one statement that writes (less server
    -- time than one statement holding every guard as a CTE, whose unused
    -- parts were still planned, started and scanned).
    --
    -- 1. The endpoint (address, else alias), the ticket already holding the
    --    key there if one is committed (``held``: a retry, the case a
    --    dedupe key exists for, then skips the guards and the insert, at
    --    the price of one index probe more on a new key), and the
    --    return_to; when restricted, the caller asks the directory who may
    --    submit (endpoints.selectors.may_submit) before anything is
    --    answered, then calls again with ``p_may_submit_restricted``.
    SELECT x.id, x.address::text AS address, x.owners_id, x.state, x.busy_policy,
        x.submit_restricted, x.paused_at,
        (SELECT t.id FROM tickets_ticket t
         WHERE t.endpoint_id = x.id AND t.dedupe_key = p_dedupe_key) AS held
    INTO e FROM endpoints_endpoint x
    WHERE x.id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = p_address),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_address));
    IF e.id IS NULL THEN
        RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_address,
            NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
            NULL::jsonb;
        RETURN;
    END IF;
    IF p_return_to IS NOT NULL THEN
        SELECT x.id, x.address, x.owners_id, x.submit_restricted
        INTO v_rt, v_rt_address, v_rt_owners, v_rt_restricted FROM endpoints_endpoint x
        WHERE x.id = COALESCE(
            (SELECT id FROM endpoints_endpoint WHERE address = p_return_to),
            (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = p_return_to));
        IF v_rt IS NULL THEN
            RETURN QUERY SELECT 'endpoint_not_found', NULL::uuid, NULL::bigint, p_return_to,
                NULL::bigint, NULL::text, 0, false, false, NULL::bigint, NULL::text, NULL::text,
                NULL::jsonb;
            RETURN;
        END IF;
    END IF;
    IF NOT p_may_submit_restricted
            AND (e.submit_restricted OR v_rt_restricted) THEN
        RETURN QUERY SELECT 'restricted', NULL::uuid, e.id, e.address, v_rt, NULL::text,
            0, false, false, NULL::bigint, NULL::text, v_rt_address, jsonb_build_array(
                jsonb_build_object('id', e.id, 'address', e.address,
                    'submit_restricted', e.submit_restricted, 'owners_id', e.owners_id),
                CASE WHEN v_rt IS NOT NULL THEN jsonb_build_object('id', v_rt,
                    'address', v_rt_address, 'submit_restricted', v_rt_restricted,
                    'owners_id', v_rt_owners) END);
        RETURN;
    END IF;

    IF e.held IS NULL THEN
        -- 2. Every guard of a new ticket: a child's parent exists and is on the
        --    trace given; the endpoint is available (quarantine fails closed); a
        --    busy "reject" endpoint takes nothing (a re-run is an owner's
        --    decision, not new work); the trace is under its hard limit, its row
        --    locked so admissions to one trace queue here (a new root trace has
        --    no row yet). A refusal is answered after the key's lookup (step 4):
        --    the ticket already holding the key is returned in any case.
        IF p_parent IS NOT NULL THEN
            SELECT t.trace_id, t.depth + 1 INTO v_trace, v_depth
            FROM tickets_ticket t WHERE t.id = p_parent;
            IF NOT FOUND THEN
                v_refusal := 'parent_not_found';
            ELSIF p_trace IS NOT NULL AND p_trace <> v_trace THEN
                v_refusal := 'trace_mismatch';
            END IF;
        END IF;
        IF v_refusal IS NULL AND e.state <> 'available' THEN
            v_refusal := 'quarantined';
        END IF;
        -- A paused "reject" endpoint takes nothing (a paused "enqueue" or
        -- "interrupt" one queues it; a re-run is an owner's decision, not new
        -- work, and queues).
        IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy = 'reject'
                AND e.paused_at IS NOT NULL THEN
            v_refusal := 'paused';
        END IF;
        IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy = 'reject' AND (
                EXISTS (SELECT 1 FROM runtime_endpointlock l
                        WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL)
                OR EXISTS (SELECT 1 FROM tickets_ticket q
                           WHERE q.endpoint_id = e.id AND q.state = 'queued')) THEN
            v_refusal := 'busy';
        END IF;
        v_trace := COALESCE(v_trace, p_trace, replace(p_id::text, '-', ''));
        -- The breaker counts per party (docs/reference/api.md, "A trace's breaker
        -- counts per party"): the submitter, or for the runtime's own
        -- admissions (a child, a callback, a re-run) the submitter of the
        -- nearest ticket up the parent (else re-run) links that has one;
        -- "-" when none has. So whoever else may add to a trace (the owner
        -- of an endpoint it reached) spends its own share, not the root's.
        v_party := p_submitted_by::text;
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
        -- A trace's budget (tickets/budgets.py): spent (``exhausted_at``,
        -- set under this same row lock by the service that counts usage, so
        -- an admission queued here behind it reads it), or past its
        -- wall-clock budget since the root's admission, the trace takes
        -- nothing more.
        IF v_refusal IS NULL AND (p_trace IS NOT NULL OR p_parent IS NOT NULL) THEN
            SELECT COALESCE((tr.parties ->> v_party)::integer, 0),
                tr.exhausted_at IS NOT NULL OR COALESCE(tr.created_at + make_interval(
                    secs => (tr.budget ->> 'wall_s')::float8) <= p_now, false)
            INTO v_held, v_spent
            FROM tickets_trace tr WHERE tr.id = v_trace FOR UPDATE;
            IF v_spent THEN
                v_refusal := 'trace_budget_exhausted';
            ELSIF COALESCE(v_held, 0) >= p_hard THEN
                v_refusal := 'circuit_open';
            END IF;
        END IF;

        -- 3. The ticket (the dispatcher is woken after commit). The ledger is
        --    the outbox: the ticket owes a dispatch (needs_dispatch), no broker
        --    round trip here. The unique key decides a race: a concurrent
        --    admission of the same key is waited for, and if it commits this
        --    inserts nothing (step 4 returns it).
        IF v_refusal IS NULL THEN
            IF p_rerun_of IS NOT NULL AND p_parent IS NOT NULL THEN
                v_root := EXISTS (SELECT 1 FROM tickets_ticket o
                                  WHERE o.id = p_rerun_of AND o.obligation_state <> 'none');
            END IF;
            INSERT INTO tickets_ticket (
                id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
                artifacts, return_to_id, continuation, callback_for_id, rerun_of_id, requester,
                submitted_by_id, callback_state, delivery_state, needs_dispatch, obligation_state,
                obligation_due_at, obligation_overdue, obligation_note, created_at, updated_at)
            VALUES (p_id, e.id, p_dedupe_key, p_sha, p_input, p_parent, v_trace, v_depth, 'queued',
                '[]'::jsonb, v_rt, p_continuation, p_callback_for, p_rerun_of,
                p_requester, p_submitted_by,
                CASE WHEN p_return_to IS NOT NULL THEN 'pending' ELSE 'none' END, 'none', true,
                CASE WHEN v_root THEN 'open' ELSE 'none' END, CASE WHEN v_root THEN p_due END,
                false, '', p_now, p_now)
            ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
            -- The dispatcher's wake follows the commit (tickets/admission.py,
            -- core/wakes.py): never a notifying write transaction.
            RETURNING true INTO v_woke;
            IF FOUND THEN
                -- Its event and its count on the trace, in one statement.
                WITH ev AS (
                    INSERT INTO tickets_ticketevent (
                        ticket_id, kind, from_state, to_state, actor, detail, at)
                    VALUES (p_id, 'admitted', '', 'queued', p_actor,
                        CASE WHEN p_parent IS NOT NULL
                             THEN jsonb_build_object('parent', p_parent::text)
                             ELSE '{}'::jsonb END, p_now)
                )
                INSERT INTO tickets_trace AS tr (id, tickets, parties, max_depth, flagged, created_at)
                VALUES (v_trace, 1, jsonb_build_object(v_party, 1), v_depth, false, p_now)
                ON CONFLICT (id) DO UPDATE
                SET tickets = tr.tickets + 1,
                    parties = tr.parties || jsonb_build_object(v_party,
                        COALESCE((tr.parties ->> v_party)::integer, 0) + 1),
                    max_depth = greatest(tr.max_depth, EXCLUDED.max_depth)
                RETURNING tr.tickets, (tr.parties ->> v_party)::integer, tr.flagged
                INTO v_count, v_party_count, v_flagged;
                o_status := 'admitted';
                -- Past the soft limit (a party's count, as the hard one) the
                -- trace is flagged once, with a warning on the ticket that
                -- passed it.
                IF v_party_count > p_soft AND NOT v_flagged THEN
                    UPDATE tickets_trace SET flagged = true WHERE id = v_trace;
                    INSERT INTO tickets_ticketevent (
                        ticket_id, kind, from_state, to_state, actor, detail, at)
                    VALUES (p_id, 'trace_soft_limit', '', '', 'circuit-breaker',
                        jsonb_build_object('trace_id', v_trace, 'tickets', v_party_count,
                            'soft_limit', p_soft),
                        p_now);
                    o_status := 'admitted_flagged';
                END IF;
                o_ticket := p_id; o_endpoint := e.id; o_address := e.address; o_return_to := v_rt;
                o_trace := v_trace; o_depth := v_depth; o_root := v_root; o_owned := false;
                o_return_to_address := v_rt_address;
                -- An "interrupt" endpoint: the turn running at this admission
                -- (its id and fencing token), which the caller asks to stop
                -- once this commits (tickets/admission.py: no I/O here). A
                -- re-run and a callback are the runtime's own, not new work;
                -- a paused endpoint's running turn finishes.
                IF e.busy_policy = 'interrupt' AND p_rerun_of IS NULL
                        AND p_callback_for IS NULL AND e.paused_at IS NULL THEN
                    SELECT jsonb_build_object('supersede', jsonb_build_object(
                        'turn', u.id, 'seq', l.token))
                    INTO o_row
                    FROM runtime_endpointlock l
                    JOIN runtime_turn u ON u.id = l.holder_id AND u.seq = l.token
                    WHERE l.endpoint_id = e.id AND u.state = 'running';
                END IF;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
    END IF;

    -- 4. The ticket that holds the key (in any state), with what its payload
    --    and the visibility check need: whether the submitter owns the
    --    endpoint, its turn's seq and state, its return_to's address. The
    --    caller compares the input hash and decides who may see it.
    IF p_dedupe_key IS NOT NULL THEN
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        LEFT JOIN runtime_turn tu ON tu.id = t.turn_id
        LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
        WHERE t.endpoint_id = e.id AND t.dedupe_key = p_dedupe_key;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Refused; or (no refusal, nothing inserted, no ticket holding the key)
    -- the winner of a race on the key is gone again: the caller may call again.
    RETURN QUERY SELECT COALESCE(v_refusal, 'retry'), NULL::uuid, e.id, e.address,
        NULL::bigint, CASE WHEN p_trace IS NOT NULL OR p_parent IS NOT NULL THEN v_trace END,
        0, false, false,
        NULL::bigint, NULL::text, NULL::text, NULL::jsonb;
END
$fn$;
