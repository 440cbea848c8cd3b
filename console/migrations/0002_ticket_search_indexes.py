"""Indexes the console's search and delivery filter read.

- ticket_id_tail_idx: ``reverse(id::text)`` so a search by the id's tail,
  as the pages print it (``…36ada1f2``), is a prefix range scan.
- ticket_delivery_idx: ``(delivery_state, id DESC)`` for the "awaiting
  approval / pending / failed" filter and the dashboard's approvals panel;
  partial: children have no delivery, and "delivered" (most finished roots)
  is common enough that walking the primary key finds a page of it at once.
"""

from django.db import migrations

INDEXES = {
    "ticket_id_tail_idx": "(reverse(id::text) text_pattern_ops)",
    "ticket_delivery_idx": (
        "(delivery_state, id DESC) WHERE delivery_state NOT IN ('none', 'delivered')"
    ),
}


def create(apps, schema_editor):
    for name, spec in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON tickets_ticket {spec}")


def drop(apps, schema_editor):
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("tickets", "0007_ticket_submitter_index"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
