"""API keys moved to the accounts app (accounts.ApiKey): the console's model
state goes; the table stays, and accounts' first migration takes it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("console", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ApiKey")], database_operations=[]
        )
    ]
