from django.db import migrations

from config.append_only import AppendOnly


class Migration(migrations.Migration):
    dependencies = [("tickets", "0001_initial")]
    operations = [AppendOnly("tickets_ticketevent", "tickets_deliveryattempt")]
