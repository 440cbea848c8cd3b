-- Admission (docs/explanation/design.md, flow 1): a request becomes a ticket,
-- or finds the ticket it already is. The hot path is this one body: the
-- endpoint, the guards of a new ticket, the ticket's row. What only some
-- admissions need is a part of its own file, called only then:
--
--   claimcheck_admit_moved     a key admitted through an alias before its route moved
--   claimcheck_admit_breaker   joining a trace: its party, budget and hard limit
--   claimcheck_admit_count     joining a trace: its count, the soft limit's flag
--   claimcheck_admit_existing  the ticket holding the key, as the caller reads it
--
-- What admission writes is what the ledger needs then (docs/explanation/scale.md,
-- "What an admission writes"): the ticket's row, which implies its admission
-- event (step 3). A root that opens its own trace (no trace given, no
-- parent, not a re-run) writes no trace row: the trace's count starts when
-- a second ticket joins it (claimcheck_admit_breaker counts the first
-- then), and the prune finds such a ticket alone (claimcheck_prune_ledger).
--
-- The result is claimcheck_admit's (retired: tickets/sql/RETIRED): one row,
-- its status in o_status (tickets/admission.py turns a refusal into its
-- documented error).
CREATE OR REPLACE FUNCTION claimcheck_admit_v2(
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
    -- A root opening a trace of its own: no trace row (above).
    v_alone boolean := p_trace IS NULL AND p_parent IS NULL AND p_rerun_of IS NULL;
    v_refusal text;
    v_party text;
    v_flagged boolean;
    v_implied boolean;
BEGIN
    -- 0. A route that moved (docs/explanation/design.md, "Routes that move"):
    --    FOR SHARE holds the alias while this admission commits, so a move
    --    (an UPDATE of the row) waits for it. The alias row is locked alone
    --    (claimcheck_admit_moved says why).
    IF p_dedupe_key IS NOT NULL THEN
        PERFORM 1 FROM endpoints_endpointalias a WHERE a.alias = p_address FOR SHARE;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM claimcheck_admit_moved(
                p_address => p_address, p_dedupe_key => p_dedupe_key,
                p_may_submit_restricted => p_may_submit_restricted,
                p_submitted_by => p_submitted_by);
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    END IF;

    -- 1. The endpoint (address, else alias), the ticket already holding the
    --    key there if one is committed (``held``: a retry skips the guards
    --    and the insert), and the return_to; when restricted, the caller
    --    asks the directory who may submit (endpoints.selectors.may_submit)
    --    before anything is answered, then calls again with
    --    ``p_may_submit_restricted``. Each step is its own small statement,
    --    run only when the request needs it (a CTE holding every guard was
    --    planned, started and scanned in full).
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
        -- 2. The guards of a new ticket: a child's parent exists and is on
        --    the trace given; the endpoint is available (quarantine fails
        --    closed); a paused or busy "reject" endpoint takes nothing (a
        --    re-run is an owner's decision, not new work, and queues); a
        --    trace joined is under its budget and hard limit
        --    (claimcheck_admit_breaker, its row locked). A refusal is
        --    answered after the key's lookup (step 4): the ticket already
        --    holding the key is returned in any case.
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
        IF v_refusal IS NULL AND NOT v_alone THEN
            SELECT b.o_refusal, b.o_party INTO v_refusal, v_party
            FROM claimcheck_admit_breaker(
                p_trace => v_trace, p_submitted_by => p_submitted_by, p_parent => p_parent,
                p_rerun_of => p_rerun_of, p_now => p_now, p_hard => p_hard) b;
        END IF;

        -- 3. The ticket (the dispatcher is woken after commit, core/wakes.py:
        --    never a notifying write transaction). The ledger is the outbox:
        --    the ticket owes a dispatch (needs_dispatch). The unique key
        --    decides a race: a concurrent admission of the same key is
        --    waited for, and if it commits this inserts nothing (step 4
        --    returns it).
        --
        --    The admission event is implied by the row: its id, taken from
        --    the events' sequence before any other event of the ticket can
        --    be, and its actor (admission_event, admission_actor; the rest
        --    is the row's: '' -> queued at created_at, its parent). Readers
        --    read the view that adds it to the event rows
        --    (tickets_ticketevent_all). The previous release's processes
        --    read the rows only: while its claimcheck_admit is installed
        --    (`post_deploy` drops it once none runs) the event is a row.
        IF v_refusal IS NULL THEN
            IF p_rerun_of IS NOT NULL AND p_parent IS NOT NULL THEN
                v_root := EXISTS (SELECT 1 FROM tickets_ticket o
                                  WHERE o.id = p_rerun_of AND o.obligation_state <> 'none');
            END IF;
            v_implied := to_regproc('claimcheck_admit') IS NULL;
            INSERT INTO tickets_ticket (
                id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
                artifacts, return_to_id, continuation, callback_for_id, rerun_of_id, requester,
                submitted_by_id, callback_state, delivery_state, needs_dispatch, obligation_state,
                obligation_due_at, obligation_overdue, obligation_note, created_at, updated_at,
                admission_event, admission_actor)
            VALUES (p_id, e.id, p_dedupe_key, p_sha, p_input, p_parent, v_trace, v_depth, 'queued',
                '[]'::jsonb, v_rt, p_continuation, p_callback_for, p_rerun_of,
                p_requester, p_submitted_by,
                CASE WHEN p_return_to IS NOT NULL THEN 'pending' ELSE 'none' END, 'none', true,
                CASE WHEN v_root THEN 'open' ELSE 'none' END, CASE WHEN v_root THEN p_due END,
                false, '', p_now, p_now,
                CASE WHEN v_implied THEN nextval('tickets_ticketevent_id_seq') END,
                CASE WHEN v_implied THEN p_actor ELSE '' END)
            ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING;
            IF FOUND THEN
                IF NOT v_implied THEN
                    INSERT INTO tickets_ticketevent (
                        ticket_id, kind, from_state, to_state, actor, detail, at)
                    VALUES (p_id, 'admitted', '', 'queued', p_actor,
                        CASE WHEN p_parent IS NOT NULL
                             THEN jsonb_build_object('parent', p_parent::text)
                             ELSE '{}'::jsonb END, p_now);
                END IF;
                o_status := 'admitted';
                -- 4. Its duties: a trace joined counts it (and is flagged
                --    past its soft limit, with a warning on this ticket).
                IF NOT v_alone THEN
                    v_flagged := claimcheck_admit_count(
                        p_trace => v_trace, p_party => v_party, p_depth => v_depth,
                        p_ticket => p_id, p_now => p_now, p_soft => p_soft);
                    IF v_flagged THEN
                        o_status := 'admitted_flagged';
                    END IF;
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

    -- 5. The ticket that holds the key, in any state.
    IF p_dedupe_key IS NOT NULL THEN
        RETURN QUERY SELECT * FROM claimcheck_admit_existing(
            p_endpoint => e.id, p_address => e.address, p_owners => e.owners_id,
            p_dedupe_key => p_dedupe_key, p_submitted_by => p_submitted_by);
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
