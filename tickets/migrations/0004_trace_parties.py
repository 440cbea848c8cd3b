# A trace's breaker counts per party (tickets/sql/claimcheck_admit_v2.sql): the
# counts live beside the trace's total. A constant default: no table rewrite.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tickets', '0003_leaner_ticket_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='trace',
            name='parties',
            field=models.JSONField(db_default=models.Value({}, models.JSONField()), default=dict),
        ),
    ]
