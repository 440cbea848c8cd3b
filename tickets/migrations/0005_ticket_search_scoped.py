"""The search's scoped index (tickets.search, issue 27): the ticket's input
and result under its submitter's and its endpoint's name, so a term is
looked up among the tickets a caller may see, not among every ticket.

``claimcheck_search_document(submitted_by, endpoint, input, result)`` is
``{"s<submitter>": {"input": ..., "result": ...}, "e<endpoint>": {...}}``;
its GIN ``jsonb_path_ops`` index holds one hash per path to a value, and a
path starts with the scope: ``{"s42": {"input": {"customer": 7}}}`` finds
submitter 42's tickets with that value in one index lookup, whatever the
others' tickets hold. The function is SQL of built-in immutable functions
only (PostgreSQL inlines it: the index expression and the query's are the
same expression), defined here and not in ``tickets/sql/``: an index
depends on it, and that folder's installer drops and recreates a changed
function. Computed on every insert and every update that changes an indexed
column, by PostgreSQL: no write path changes.

Built ``CONCURRENTLY`` (hence non-atomic), as 0004's; an interrupted build
leaves an ``INVALID`` index of that name to drop before running it again
(docs/deploy.md)."""

from django.db import migrations

SCOPED_DOCUMENT = """
CREATE OR REPLACE FUNCTION claimcheck_search_document(
    p_submitter bigint, p_endpoint bigint, p_input jsonb, p_result jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    -- One expression of built-in immutable functions (jsonb_set, not
    -- jsonb_build_object, which is stable; text || text, not text || bigint;
    -- no FROM): PostgreSQL then inlines it, here and in the index.
    SELECT pg_catalog.jsonb_set(
        pg_catalog.jsonb_set(
            '{}'::jsonb,
            ARRAY['e' || p_endpoint::text],
            pg_catalog.jsonb_set(
                pg_catalog.jsonb_set('{"input": null, "result": null}'::jsonb, '{input}', p_input),
                '{result}', COALESCE(p_result, 'null'::jsonb))),
        ARRAY['s' || COALESCE(p_submitter::text, '')],
        pg_catalog.jsonb_set(
            pg_catalog.jsonb_set('{"input": null, "result": null}'::jsonb, '{input}', p_input),
            '{result}', COALESCE(p_result, 'null'::jsonb)))
$fn$;
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tickets", "0004_ticket_search_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            SCOPED_DOCUMENT,
            reverse_sql="DROP FUNCTION claimcheck_search_document(bigint, bigint, jsonb, jsonb)",
        ),
        # Not in Ticket.Meta.indexes: Django writes an operator class on an
        # expression only with django.contrib.postgres installed (as
        # console's ticket_id_tail_idx, an index the model does not name).
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY ticket_search_scoped_idx ON tickets_ticket USING gin "
            "(claimcheck_search_document(submitted_by_id, endpoint_id, input, result) "
            "jsonb_path_ops)",
            reverse_sql="DROP INDEX CONCURRENTLY ticket_search_scoped_idx",
        ),
    ]
