"""Retention's privileged path (tickets/retention.py): the append-only row
trigger lets a DELETE through only inside claimcheck_prune_ledger, a
SECURITY DEFINER function owned by the migrating (owner) role. The
application role is granted EXECUTE after migrate (config/db_roles.py)."""

from django.db import migrations

from config.append_only import PG_FUNCTION
from tickets.retention import DROP_SQL, function_sql


def forward(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT pg_catalog.current_schema()")
        schema = schema_editor.connection.ops.quote_name(cur.fetchone()[0])
    schema_editor.execute(PG_FUNCTION, params=None)
    schema_editor.execute(function_sql(schema), params=None)


def backward(apps, schema_editor):
    schema_editor.execute(DROP_SQL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("tickets", "0007_ticket_submitter_index"),
        ("endpoints", "0003_authz"),
        ("recovery", "0003_refuse_truncate"),
    ]
    operations = [migrations.RunPython(forward, backward)]
