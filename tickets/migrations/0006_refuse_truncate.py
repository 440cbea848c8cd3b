from django.db import migrations

from config.append_only import RefuseTruncate


class Migration(migrations.Migration):
    # TRUNCATE skips row triggers: the append-only tables refuse it with a
    # statement trigger of their own (config/append_only.py).
    dependencies = [("tickets", "0005_ticket_needs_dispatch")]
    operations = [RefuseTruncate("tickets_ticketevent", "tickets_deliveryattempt")]
