-- The delivery of a ticket that became terminal, opened in the terminal
-- transition's transaction (the caller holds the ticket row and has checked
-- that the ticket answers a requester). Returns what the terminal event
-- records of it, or NULL when one is open already.
CREATE OR REPLACE FUNCTION claimcheck_open_delivery(p_ticket uuid, p_delivery uuid, p_now timestamptz)
RETURNS TABLE (o_id uuid, o_mode text, o_state text, o_due boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_url text;
    v_state text;
BEGIN
    IF EXISTS (SELECT 1 FROM tickets_delivery d WHERE d.ticket_id = p_ticket) THEN
        RETURN;
    END IF;
    SELECT COALESCE(t.requester->>'webhook_url', ''),
        CASE WHEN e.requires_approval AND t.approved_at IS NULL
             THEN 'awaiting_approval' ELSE 'pending' END
    INTO v_url, v_state
    FROM tickets_ticket t JOIN endpoints_endpoint e ON e.id = t.endpoint_id
    WHERE t.id = p_ticket;
    -- next_attempt_at = now though the caller publishes at once: if the
    -- publish is lost (broker down), the delivery sweep still finds it due.
    INSERT INTO tickets_delivery (
        id, ticket_id, mode, url, attempts, next_attempt_at, last_error, delivered_at, created_at)
    VALUES (p_delivery, p_ticket, CASE WHEN v_url <> '' THEN 'webhook' ELSE 'pull' END, v_url, 0,
        CASE WHEN v_url <> '' AND v_state = 'pending' THEN p_now END, '', NULL, p_now);
    RETURN QUERY SELECT p_delivery, CASE WHEN v_url <> '' THEN 'webhook' ELSE 'pull' END, v_state,
        v_url <> '' AND v_state = 'pending';
END
$fn$;
