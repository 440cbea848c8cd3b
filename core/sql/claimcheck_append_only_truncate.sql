-- The statement trigger of an append-only table (core/append_only.py):
-- TRUNCATE refused, but for the owner role in a session that set
-- claimcheck.allow_truncate = on (a maintenance session, the test suite's
-- flush between transactional tests). pg_catalog is spelled out: a
-- session's temporary schema is searched before pg_catalog for relations,
-- so an unqualified pg_class could be shadowed by a temporary table of the
-- caller's.
CREATE OR REPLACE FUNCTION claimcheck_append_only_truncate() RETURNS trigger AS $$
BEGIN
    IF pg_catalog.current_setting('claimcheck.allow_truncate', true) = 'on'
       AND pg_catalog.pg_has_role(
           current_user,
           (SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID),
           'USAGE') THEN
        RETURN NULL;  -- a statement trigger's value is ignored: TRUNCATE proceeds
    END IF;
    RAISE EXCEPTION 'append-only table %: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'only the owner role, in a session with claimcheck.allow_truncate = on';
END;
$$ LANGUAGE plpgsql;
