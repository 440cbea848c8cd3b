-- The row trigger of an append-only table (core/append_only.py): UPDATE
-- refused always, DELETE except on the retention path (tickets/retention.py):
-- inside claimcheck_prune_ledger, a SECURITY DEFINER function owned by the
-- owner role, which sets claimcheck.pruning = on for its own transaction.
-- Both are checked: the setting (anyone may set it) and that the current
-- role holds the table owner's privileges (inside the function current_user
-- is its owner; the application role owns nothing), so the application role
-- can delete only what that function's retention rule selects.
CREATE OR REPLACE FUNCTION claimcheck_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND pg_catalog.current_setting('claimcheck.pruning', true) = 'on'
       AND pg_catalog.pg_has_role(
           current_user,
           (SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID),
           'USAGE') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'append-only table %: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
