-- The finish's last duty: the lock released, and the endpoint's next
-- ticket (claimcheck_release_lock). With p_next_turn the worker that
-- finishes starts it here, in the finish's transaction: the same start as
-- a message's (claimcheck_start_turn, with every guard of its own: the
-- endpoint available and not paused, the oldest queued ticket first, the
-- message's ticket marked when another starts or none does), the new turn
-- carrying this worker's task id; nothing is then left to publish
-- (o_next NULL). Without it, o_next is the ticket the caller publishes.
CREATE OR REPLACE FUNCTION claimcheck_finish_next(
    p_endpoint bigint, p_turn uuid,
    p_next_turn uuid, p_task text, p_worker jsonb, p_next_token_sha256 text, p_next_actor text,
    p_node text, p_pid integer,
    OUT o_next uuid, OUT o_next_endpoint endpoints_endpoint, OUT o_next_turn runtime_turn,
    OUT o_next_ticket tickets_ticket
) LANGUAGE plpgsql AS $fn$
DECLARE
    v_started record;
BEGIN
    o_next := claimcheck_release_lock(p_endpoint => p_endpoint, p_turn => p_turn);
    IF o_next IS NOT NULL AND p_next_turn IS NOT NULL THEN
        SELECT s.o_endpoint, s.o_turn, s.o_ticket INTO v_started
        FROM claimcheck_start_turn(p_ticket => o_next, p_turn => p_next_turn,
            p_task => p_task, p_worker => p_worker, p_token_sha256 => p_next_token_sha256,
            p_actor => p_next_actor, p_node => p_node, p_pid => p_pid) s;
        IF FOUND THEN
            o_next_endpoint := v_started.o_endpoint;
            o_next_turn := v_started.o_turn;
            o_next_ticket := v_started.o_ticket;
        END IF;
        o_next := NULL;
    END IF;
END
$fn$;
