"""Fair-share limits of a key's own (accounts.ApiKey)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="rate_limit_admissions",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="apikey",
            name="rate_limit_concurrent_requests",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
