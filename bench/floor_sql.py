"""The admission floor's statement: one CTE that inserts a root ticket, its
event and its trace row (``INSERT ... ON CONFLICT DO NOTHING``) or returns the
ticket already holding the key, whole. It was the application's admission
fast path until admission became one function (``claimcheck_admit``, now
tickets/sql/claimcheck_admit_v2.sql); the benchmarks keep it, as it
was, as the least a one-statement admission can cost, so ratios stay
comparable across that change."""

ADMISSION_CTE = """
WITH ep AS (
    SELECT e.id, e.address, e.owners_id FROM endpoints_endpoint e
    WHERE e.id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = %(address)s),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = %(address)s))
      AND e.state = 'available'
      AND NOT e.submit_restricted
      AND (e.busy_policy = 'enqueue' OR NOT EXISTS (
            SELECT 1 FROM runtime_endpointlock l
            WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL))
),
ins AS (
    INSERT INTO tickets_ticket (
        id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state,
        artifacts, requester, submitted_by_id, callback_state, delivery_state,
        needs_dispatch, obligation_state, obligation_due_at, obligation_overdue,
        obligation_note, created_at, updated_at)
    SELECT %(id)s, ep.id, %(dedupe_key)s, %(sha)s, %(input)s::jsonb, %(trace_id)s, 0, 'queued',
        '[]'::jsonb, %(requester)s::jsonb, %(submitted_by_id)s, 'none', 'none',
        true, 'open', %(due)s, false, '', %(now)s, %(now)s
    FROM ep
    ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
    -- The ledger is the outbox: the ticket owes a dispatch (needs_dispatch)
    -- and the dispatcher is woken when this statement commits. No broker
    -- round trip on the request path.
    RETURNING id, endpoint_id, pg_notify('claimcheck_dispatch', '') IS NULL AS woke
),
ev AS (
    INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
    SELECT id, 'admitted', '', 'queued', %(actor)s, '{}'::jsonb, %(now)s FROM ins
),
tr AS (
    INSERT INTO tickets_trace (id, tickets, max_depth, flagged, created_at)
    SELECT %(trace_id)s, 1, 0, false, %(now)s FROM ins
)
SELECT ins.id, ins.endpoint_id, ep.address, true, NULL, NULL, NULL, NULL, NULL::jsonb
FROM ins, ep
UNION ALL
-- Not inserted: the ticket that already holds the key (committed before this
-- statement began; a racing one is left to the general path), whole, with
-- what its payload and the visibility check need: whether the submitter owns
-- the endpoint (a member of its owners group, as owned_endpoint_ids), its
-- turn's seq and state, its return_to's address. A duplicate is one round trip.
SELECT t.id, t.endpoint_id, ep.address, false,
    EXISTS (SELECT 1 FROM auth_user_groups ug
            WHERE ug.group_id = ep.owners_id AND ug.user_id = %(submitted_by_id)s),
    tu.seq, tu.state, rt.address, to_jsonb(t)
FROM tickets_ticket t JOIN ep ON t.endpoint_id = ep.id
LEFT JOIN runtime_turn tu ON tu.id = t.turn_id
LEFT JOIN endpoints_endpoint rt ON rt.id = t.return_to_id
WHERE t.dedupe_key = %(dedupe_key)s AND NOT EXISTS (SELECT 1 FROM ins)
"""
