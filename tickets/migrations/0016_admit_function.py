"""``claimcheck_admit``: admission, the one implementation
(``tickets.admission.admit_ticket`` calls it). A PL/pgSQL function keeps its
statements' plans in the server session, so admission is planned once per
connection without protocol-level prepared statements, which PgBouncer in
transaction mode (1.18) does not carry."""

from django.db import migrations

ADMIT = r"""
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
    v_trace text := p_trace;
    v_depth integer := 0;
    v_root boolean := p_parent IS NULL;
    v_refusal text;
    v_count integer;
    v_flagged boolean;
    v_inserted uuid;
BEGIN
    -- 1. The canonical endpoint of the address or an alias; the return_to's.
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
    -- 2. A restricted endpoint (or return_to): the caller asks the directory
    --    who may submit (endpoints.selectors.may_submit) before anything is
    --    looked up, then calls again.
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
    -- 3. What would refuse a new ticket: a parent that does not exist or is
    --    on another trace (a child joins its parent's trace one level
    --    deeper), quarantine (fail closed), a busy "reject" endpoint (a re-run
    --    is an owner's decision, not new work competing for it), the circuit
    --    breaker (the trace row locked, so admissions to one trace queue here
    --    and the limit cannot be overshot; a new root trace has no row yet).
    IF p_parent IS NOT NULL THEN
        SELECT t.trace_id, t.depth + 1 INTO v_trace, v_depth FROM tickets_ticket t
        WHERE t.id = p_parent;
        IF NOT FOUND THEN
            v_refusal := 'parent_not_found';
        ELSIF p_trace IS NOT NULL AND p_trace <> v_trace THEN
            v_refusal := 'trace_mismatch';
        END IF;
    END IF;
    IF v_refusal IS NULL AND e.state <> 'available' THEN
        v_refusal := 'quarantined';
    END IF;
    IF v_refusal IS NULL AND p_rerun_of IS NULL AND e.busy_policy <> 'enqueue' AND (
            EXISTS (SELECT 1 FROM endpoints_endpointlock l
                    WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL)
            OR EXISTS (SELECT 1 FROM tickets_ticket q
                       WHERE q.endpoint_id = e.id AND q.state = 'queued')) THEN
        v_refusal := 'busy';
    END IF;
    v_trace := COALESCE(v_trace, replace(p_id::text, '-', ''));
    IF v_refusal IS NULL AND (p_trace IS NOT NULL OR p_parent IS NOT NULL) THEN
        SELECT tr.tickets INTO v_count FROM tickets_trace tr WHERE tr.id = v_trace FOR UPDATE;
        IF COALESCE(v_count, 0) + 1 > p_hard THEN
            v_refusal := 'circuit_open';
        END IF;
    END IF;
    -- 4. The ticket holding the key, in any state, whole (the caller compares
    --    the input hash and decides who may see it): the answer to a repeat
    --    whatever would refuse a new ticket.
    IF v_refusal IS NOT NULL THEN
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
        RETURN QUERY SELECT v_refusal, NULL::uuid, e.id, e.address::text, NULL::bigint, v_trace,
            0, false, false, NULL::bigint, NULL::text, NULL::text, NULL::jsonb;
        RETURN;
    END IF;
    -- A re-run carries its original's obligation to the requester; a child's
    -- re-run has none (it answers the waiting parent through the callback).
    IF NOT v_root AND p_rerun_of IS NOT NULL THEN
        v_root := EXISTS (SELECT 1 FROM tickets_ticket o
                          WHERE o.id = p_rerun_of AND o.obligation_state <> 'none');
    END IF;
    -- 5. The ticket, its event and its count on the trace, in one statement.
    --    The unique (endpoint, dedupe_key) decides a race: the loser's insert
    --    waits for the winner's commit and does nothing. The ledger is the
    --    outbox: the ticket owes a dispatch (needs_dispatch) and the
    --    dispatcher is woken at commit; no broker round trip here.
    WITH ins AS (
        INSERT INTO tickets_ticket (
            id, endpoint_id, dedupe_key, input_sha256, input, parent_id, trace_id, depth, state,
            artifacts, return_to_id, continuation, callback_for_id, rerun_of_id, requester,
            submitted_by_id, callback_state, delivery_state, needs_dispatch, obligation_state,
            obligation_due_at, obligation_overdue, obligation_note, created_at, updated_at,
            version)
        VALUES (p_id, e.id, p_dedupe_key, p_sha, p_input, p_parent, v_trace, v_depth, 'queued',
            '[]'::jsonb, rt.id, p_continuation, p_callback_for, p_rerun_of, p_requester,
            p_submitted_by, CASE WHEN rt.id IS NOT NULL THEN 'pending' ELSE 'none' END, 'none',
            true, CASE WHEN v_root THEN 'open' ELSE 'none' END,
            CASE WHEN v_root THEN p_due END, false, '', p_now, p_now, 1)
        ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
        RETURNING id
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
        SELECT v_trace, 1, v_depth, false, p_now FROM ins
        ON CONFLICT (id) DO UPDATE
        SET tickets = tr.tickets + 1, max_depth = greatest(tr.max_depth, EXCLUDED.max_depth)
        RETURNING tr.tickets, tr.flagged
    )
    SELECT ins.id, tr.tickets, tr.flagged INTO v_inserted, v_count, v_flagged FROM ins, tr;
    IF v_inserted IS NOT NULL THEN
        PERFORM pg_notify('claimcheck_dispatch', '');
    ELSE
        RETURN QUERY SELECT 'existing', t.id, e.id, e.address::text, t.return_to_id,
            t.trace_id::text, t.depth, false,
            EXISTS (SELECT 1 FROM auth_user_groups ug
                    WHERE ug.group_id = e.owners_id AND ug.user_id = p_submitted_by),
            tu.seq, tu.state::text, rte.address::text, to_jsonb(t)
        FROM tickets_ticket t
        LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
        LEFT JOIN endpoints_endpoint rte ON rte.id = t.return_to_id
        WHERE t.endpoint_id = e.id AND t.dedupe_key = p_dedupe_key;
        RETURN;
    END IF;
    -- 6. Past the soft limit the trace is flagged once, with a warning on
    --    the ticket that passed it.
    IF v_count > p_soft AND NOT v_flagged THEN
        UPDATE tickets_trace SET flagged = true WHERE id = v_trace;
        INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
        VALUES (p_id, 'trace_soft_limit', '', '', 'circuit-breaker',
            jsonb_build_object('trace_id', v_trace, 'tickets', v_count, 'soft_limit', p_soft),
            p_now);
    END IF;
    RETURN QUERY SELECT CASE WHEN v_count > p_soft AND NOT v_flagged THEN 'admitted_flagged'
                             ELSE 'admitted' END,
        p_id, e.id, e.address::text, rt.id, v_trace, v_depth, v_root, false, NULL::bigint,
        NULL::text, rt.address::text, NULL::jsonb;
END
$fn$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("tickets", "0015_open_delivery_function"),
    ]

    operations = [
        migrations.RunSQL(
            ADMIT,
            reverse_sql="DROP FUNCTION claimcheck_admit(uuid, text, text, text, jsonb, uuid, text,"
            " text, jsonb, jsonb, uuid, uuid, integer, boolean, text, timestamptz, timestamptz,"
            " integer, integer)",
        ),
    ]
