# Ticket.version goes: every change of a ticket appends an event in its
# transaction, and the newest event id is the change token.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tickets", "0001_initial"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="ticket",
            name="version",
        ),
    ]
