-- The delivery of a ticket that became terminal, opened in the terminal
-- move's transaction by its one caller, claimcheck_ticket_owes (which holds
-- the ticket row and has checked that the ticket owes one). Returns what
-- the terminal event records of it, or no row when one is open already.
-- One statement.
CREATE OR REPLACE FUNCTION claimcheck_open_delivery(p_ticket uuid, p_delivery uuid, p_now timestamptz)
RETURNS TABLE (o_id uuid, o_mode text, o_state text, o_due boolean)
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY
    WITH d AS (
        SELECT COALESCE(t.requester->>'webhook_url', '') AS url,
            CASE WHEN e.requires_approval AND t.approved_at IS NULL
                 THEN 'awaiting_approval' ELSE 'pending' END AS state
        FROM tickets_ticket t JOIN endpoints_endpoint e ON e.id = t.endpoint_id
        WHERE t.id = p_ticket
          AND NOT EXISTS (SELECT 1 FROM tickets_delivery x WHERE x.ticket_id = p_ticket)
    ),
    -- next_attempt_at = now though the caller publishes at once: if the
    -- publish is lost (broker down), the delivery sweep still finds it due.
    ins AS (
        INSERT INTO tickets_delivery (
            id, ticket_id, mode, url, attempts, next_attempt_at, last_error, delivered_at,
            created_at)
        SELECT p_delivery, p_ticket, CASE WHEN d.url <> '' THEN 'webhook' ELSE 'pull' END, d.url,
            0, CASE WHEN d.url <> '' AND d.state = 'pending' THEN p_now END, '', NULL, p_now
        FROM d
        RETURNING id, mode
    )
    SELECT ins.id, ins.mode::text, d.state, d.url <> '' AND d.state = 'pending' FROM ins, d;
END
$fn$;
