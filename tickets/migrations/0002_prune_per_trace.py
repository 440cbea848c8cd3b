"""``claimcheck_prune_ledger`` reads one trace at a time and skips a trace an
admission is joining (tickets/retention.py)."""

from django.db import migrations

from tickets.retention import DROP_SQL, function_sql


def _prune_function(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT pg_catalog.current_schema()")
        schema = schema_editor.connection.ops.quote_name(cur.fetchone()[0])
    schema_editor.execute(function_sql(schema), params=None)


class Migration(migrations.Migration):
    dependencies = [("tickets", "0001_initial")]

    operations = [migrations.RunPython(_prune_function, migrations.RunPython.noop)]
