from django.db import migrations

from config.append_only import RefuseTruncate


class Migration(migrations.Migration):
    # TRUNCATE skips row triggers: the append-only tables refuse it with a
    # statement trigger of their own (config/append_only.py).
    dependencies = [("recovery", "0002_append_only")]
    operations = [
        RefuseTruncate(
            "recovery_inspection",
            "recovery_decision",
            "recovery_lesson",
            "recovery_caseevidence",
        )
    ]
