from django.db import migrations

from config.append_only import AppendOnly


class Migration(migrations.Migration):
    dependencies = [("recovery", "0001_initial")]
    operations = [
        AppendOnly(
            "recovery_inspection",
            "recovery_decision",
            "recovery_lesson",
            "recovery_caseevidence",
        )
    ]
