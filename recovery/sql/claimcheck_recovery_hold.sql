-- Recovery's retention holds: a case's ticket (and its turn's ticket) and a
-- decision's re-run are held in the ledger (tickets_retentionhold), so the
-- prune, which reads only the ledger's tables (claimcheck_prune_keeps),
-- keeps them: a case's record outlives the retention window, and so does
-- every ticket it points at. A trigger on recovery's own tables, so no way
-- of making a case or a decision (a service, a sweep, the previous
-- release's processes during an upgrade) leaves its tickets unheld.
-- Decisions are append-only: a decision's re-run is held at its insert.
--
-- The file ends by holding what the cases and decisions made before the
-- trigger point at (idempotent), in the transaction that creates the
-- trigger: creating it waits for the inserts in flight and holds off new
-- ones until commit, so no case is left between the two (a data migration
-- would run before the trigger exists, and leave the previous release's
-- cases of the moments between unheld).
CREATE OR REPLACE FUNCTION claimcheck_recovery_hold() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_TABLE_NAME = 'recovery_recoverycase' THEN
        INSERT INTO tickets_retentionhold (ticket_id, held_by, since)
        SELECT x.ticket_id, 'recovery case ' || NEW.id, NEW.opened_at
          FROM (SELECT NEW.ticket_id
                UNION
                SELECT u.ticket_id FROM runtime_turn u WHERE u.id = NEW.turn_id) x (ticket_id)
        ON CONFLICT (ticket_id, held_by) DO NOTHING;
    ELSIF NEW.rerun_ticket_id IS NOT NULL THEN
        INSERT INTO tickets_retentionhold (ticket_id, held_by, since)
        VALUES (NEW.rerun_ticket_id, 'recovery decision ' || NEW.id, NEW.created_at)
        ON CONFLICT (ticket_id, held_by) DO NOTHING;
    END IF;
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER recovery_recoverycase_retention_hold
    AFTER INSERT OR UPDATE OF ticket_id, turn_id ON recovery_recoverycase
    FOR EACH ROW EXECUTE FUNCTION claimcheck_recovery_hold();
CREATE OR REPLACE TRIGGER recovery_decision_retention_hold
    AFTER INSERT ON recovery_decision
    FOR EACH ROW EXECUTE FUNCTION claimcheck_recovery_hold();
INSERT INTO tickets_retentionhold (ticket_id, held_by, since)
SELECT c.ticket_id, 'recovery case ' || c.id, c.opened_at FROM recovery_recoverycase c
UNION
SELECT u.ticket_id, 'recovery case ' || c.id, c.opened_at
  FROM recovery_recoverycase c JOIN runtime_turn u ON u.id = c.turn_id
UNION
SELECT x.rerun_ticket_id, 'recovery decision ' || x.id, x.created_at
  FROM recovery_decision x WHERE x.rerun_ticket_id IS NOT NULL
ON CONFLICT (ticket_id, held_by) DO NOTHING;
