"""The turns, the endpoint's lock and its history became the ledger's
models (tickets/models.py) under their old table names, so the database
has nothing to change: a database migrated before has them from runtime's
0001 and 0002 as they were then, a fresh one from tickets' 0001 (the two
are the same schema, tests/config/test_schema_upgrade.py).

What the database keeps of the old owner is the models' content types
(``runtime.turn`` ...), to which their permissions and the admin's log
entries point: they are renamed in place, so a permission given on a turn
stays given. A database that has ``tickets.turn`` already (a process of
this release asked for it before ``migrate`` ran) keeps both, and a
``runtime.turn`` that a process of the previous release makes again during
the upgrade is stale once they stop: ``manage.py
remove_stale_contenttypes`` clears either. Rows are updated, no table is
rewritten or locked: safe while the previous release runs."""

from django.db import migrations

MODELS = ("turn", "endpointlock", "contextentry")


def _relabel(source: str, target: str):
    def run(apps, schema_editor):
        content_type = apps.get_model("contenttypes", "ContentType")
        db = schema_editor.connection.alias
        for model in MODELS:
            if content_type.objects.using(db).filter(app_label=target, model=model).exists():
                continue
            content_type.objects.using(db).filter(app_label=source, model=model).update(
                app_label=target
            )

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("tickets", "0006_trace_budget"),
    ]

    operations = [
        migrations.RunPython(_relabel("runtime", "tickets"), _relabel("tickets", "runtime")),
    ]
