-- A ticket's transition after its start, with what it owes: the one
-- database-side mechanism every Python service moves a ticket through
-- (tickets/lifecycle.py transition: a cancel, a resume, a quarantine, an
-- owner's recovery decision). A turn's finish writes its move from the
-- same parts (claimcheck_finish_turn: claimcheck_ticket_owes, then
-- claimcheck_ticket_write). In the caller's transaction:
--   1. the check: the ticket's row locked (FOR NO KEY UPDATE, what the
--      update takes anyway: a caller holding the row waits for nothing)
--      and its state p_expected. Otherwise nothing is written: o_moved
--      false, o_state the state found (NULL: no such ticket);
--   2. what it owes before the write (claimcheck_ticket_owes): the
--      delivery of a terminal ticket that answers a requester;
--   3. the write (claimcheck_ticket_write): the move and its event;
--   4. an orphan superseded by a re-run passes what it owed to the re-run:
--      the callback to its parent (callback_passed: the re-run's terminal
--      state sends the one callback, DESIGN.md flow 7) and the requester's
--      obligation (obligation_passed), each with its event.
-- What is left to Python is tickets/terminal.py after_move's, for this and
-- the finish alike: o_delivery published when o_due, the callback admitted
-- when o_reports (callbacks.ensure_callback decides whether one is owed),
-- the watchers woken after commit.
CREATE OR REPLACE FUNCTION claimcheck_ticket_move(
    p_ticket uuid, p_expected text, p_to text, p_kind text, p_actor text,
    p_turn uuid, p_detail jsonb, p_now timestamptz, p_delivery uuid,
    p_error jsonb, p_result jsonb, p_artifacts jsonb, p_completed_by_turn uuid,
    OUT o_moved boolean, OUT o_state text, OUT o_delivery uuid, OUT o_due boolean,
    OUT o_reports boolean
) LANGUAGE plpgsql AS $fn$
DECLARE
    t tickets_ticket;
    v_owes record;
BEGIN
    o_moved := false; o_due := false; o_reports := false;
    -- 1. The check.
    SELECT * INTO t FROM tickets_ticket x WHERE x.id = p_ticket FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    o_state := t.state;
    IF t.state <> p_expected THEN
        RETURN;
    END IF;

    -- 2. What it owes before the write.
    SELECT w.* INTO v_owes
    FROM claimcheck_ticket_owes(p_ticket => t, p_to => p_to, p_detail => p_detail,
        p_delivery => p_delivery, p_now => p_now) w;

    -- 3. The write. The row is locked and was checked above: a miss is a bug.
    IF NOT claimcheck_ticket_write(p_ticket => p_ticket, p_expected => p_expected, p_to => p_to,
            p_kind => p_kind, p_actor => p_actor, p_turn => p_turn, p_detail => v_owes.o_detail,
            p_now => p_now, p_error => p_error, p_result => p_result,
            p_artifacts => p_artifacts, p_completed_by_turn => p_completed_by_turn,
            p_delivery_state => v_owes.o_delivery_state) THEN
        RAISE EXCEPTION 'ticket % is no longer %', p_ticket, p_expected;
    END IF;

    -- 4. An orphan superseded by a re-run passes what it owed.
    IF v_owes.o_rerun IS NOT NULL THEN
        IF t.return_to_id IS NOT NULL AND t.callback_state = 'pending' THEN
            UPDATE tickets_ticket x SET callback_state = 'none', updated_at = p_now
            WHERE x.id = p_ticket;
            INSERT INTO tickets_ticketevent (
                ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
            VALUES (p_ticket, 'callback_passed', '', '', 'recovery', NULL,
                jsonb_build_object('rerun', v_owes.o_rerun::text), p_now);
        END IF;
        IF claimcheck_ticket_root_like(p_parent => t.parent_id, p_rerun_of => t.rerun_of_id,
                p_obligation_state => t.obligation_state)
                AND t.obligation_state = 'open' THEN
            UPDATE tickets_ticket x SET obligation_state = 'closed', updated_at = p_now,
                obligation_note = format(
                    'superseded by re-run %s, which answers the requester', v_owes.o_rerun)
            WHERE x.id = p_ticket;
            INSERT INTO tickets_ticketevent (
                ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
            VALUES (p_ticket, 'obligation_passed', '', '', 'recovery', NULL,
                jsonb_build_object('rerun', v_owes.o_rerun::text), p_now);
        END IF;
    END IF;

    o_moved := true;
    o_delivery := v_owes.o_delivery;
    o_due := v_owes.o_due;
    o_reports := t.return_to_id IS NOT NULL;
END
$fn$;
