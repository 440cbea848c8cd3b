"""The console's search by an id's tail reads a smaller index (issue 12:
bytes per ticket). ticket_id_tail_idx held the whole id as reversed text,
37 bytes a key (75 B a ticket at 50,000 tickets); it now holds the id's
last group, its last twelve characters (48 random bits of a UUIDv7), whose
entry is padded to the same 24 bytes as an eight-character one. The search
narrows on it and checks the whole tail on the rows it finds
(tickets.selectors.find_tickets).

Built and dropped CONCURRENTLY (no lock on the ledger's writes; hence a
non-atomic migration)."""

from django.db import migrations

from config import concurrent_index

NAME = "ticket_id_tail_idx"
NEW = "(reverse(right(id::text, 12)) text_pattern_ops)"
OLD = "(reverse(id::text) text_pattern_ops)"


def _swap(schema_editor, spec: str) -> None:
    concurrent_index.rebuild(schema_editor, NAME, f"tickets_ticket {spec}")


def forward(apps, schema_editor):
    _swap(schema_editor, NEW)


def backward(apps, schema_editor):
    _swap(schema_editor, OLD)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("console", "0002_ticket_search_indexes"),
        ("tickets", "0011_smaller_ledger_indexes"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
