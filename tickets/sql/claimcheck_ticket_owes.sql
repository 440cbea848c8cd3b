-- What a ticket owes as it moves to p_to, done before the move is written:
-- the one home of "owes a delivery". A terminal ticket that answers a
-- requester (claimcheck_ticket_root_like) opens its delivery
-- (claimcheck_open_delivery, none if one is open already), unless a re-run
-- supersedes it: an orphan whose re-run was admitted in the same decision
-- passes the requester to the re-run (o_rerun; claimcheck_ticket_move
-- passes what it owes). o_detail is p_detail with what the transition's
-- event records of the delivery it opened (one event for the one
-- transaction); o_delivery_state is what the move writes on the ticket.
-- p_ticket is the row before the move, locked by the caller. Called by
-- both writers of a ticket's move: claimcheck_ticket_move and a turn's
-- finish (claimcheck_finish_turn).
CREATE OR REPLACE FUNCTION claimcheck_ticket_owes(
    p_ticket tickets_ticket, p_to text, p_detail jsonb, p_delivery uuid, p_now timestamptz,
    OUT o_detail jsonb, OUT o_delivery uuid, OUT o_delivery_state text, OUT o_due boolean,
    OUT o_rerun uuid
) LANGUAGE plpgsql AS $fn$
DECLARE
    v_mode text;
BEGIN
    o_detail := COALESCE(p_detail, '{}'::jsonb);
    o_due := false;
    IF p_to NOT IN ('succeeded', 'failed', 'cancelled', 'orphaned') THEN
        RETURN;
    END IF;
    IF p_to = 'orphaned' THEN
        SELECT r.id INTO o_rerun FROM tickets_ticket r
        WHERE r.rerun_of_id = (p_ticket).id ORDER BY r.id LIMIT 1;
    END IF;
    IF o_rerun IS NULL AND claimcheck_ticket_root_like(p_parent => (p_ticket).parent_id,
            p_rerun_of => (p_ticket).rerun_of_id,
            p_obligation_state => (p_ticket).obligation_state) THEN
        SELECT d.o_id, d.o_mode, d.o_state, d.o_due INTO o_delivery, v_mode, o_delivery_state, o_due
        FROM claimcheck_open_delivery(p_ticket => (p_ticket).id, p_delivery => p_delivery,
            p_now => p_now) d;
        o_due := COALESCE(o_due, false);
        IF o_delivery IS NOT NULL THEN
            o_detail := o_detail || jsonb_build_object('delivery_opened',
                jsonb_build_object('mode', v_mode, 'state', o_delivery_state));
        END IF;
    END IF;
END
$fn$;
