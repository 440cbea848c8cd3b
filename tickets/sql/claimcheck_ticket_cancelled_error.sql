-- A cancelled ticket's error, one text whichever way it was cancelled: at
-- once (queued or waiting: tickets/lifecycle.py request_cancel, whose move
-- is given no error and gets this one from claimcheck_ticket_write, naming
-- the move's actor) or once its turn was proven stopped
-- (claimcheck_finish_outcome, naming the actor of the cancel_requested
-- event).
CREATE OR REPLACE FUNCTION claimcheck_ticket_cancelled_error(p_actor text)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT jsonb_build_object('code', 'cancelled', 'detail', 'cancelled by ' || p_actor)
$fn$;
