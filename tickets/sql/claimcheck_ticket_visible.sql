-- Who may see a ticket (API.md "Who may see and do what"): the user who
-- submitted it, the owners of its endpoint, and whoever acts as the owner
-- of every endpoint (staff). The one home of the rule: every read on
-- behalf of a user filters with it (tickets/selectors.py visible_tickets,
-- through tickets/rules.py Visible), and an admission answers with it
-- whether the ticket holding a key is the submitter's to see
-- (claimcheck_admit_existing, claimcheck_admit_moved). p_owned is the
-- endpoints p_user owns, NULL for one who owns them all
-- (endpoints/selectors.py owned_endpoint_ids).
--
-- IMMUTABLE SQL, one expression and no sub-query: PostgreSQL inlines it
-- into the caller's WHERE, and with the user's values constant the CASE
-- folds to its one branch, so a list keeps its index plan: a caller who
-- owns nothing reads "submitted_by_id = me" (ticket_submitter_id_idx's
-- prefix, in order), an owner's filter adds "endpoint_id = ANY (owned)"
-- (the (endpoint, -id) index), staff's is no filter at all.
CREATE OR REPLACE FUNCTION claimcheck_ticket_visible(
    p_submitted_by integer, p_endpoint bigint, p_user integer, p_owned bigint[]
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE
        WHEN p_owned IS NULL THEN true
        WHEN cardinality(p_owned) = 0 THEN p_submitted_by = p_user
        ELSE p_submitted_by = p_user OR p_endpoint = ANY (p_owned)
    END
$fn$;
