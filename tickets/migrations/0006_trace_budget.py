# A trace's budget and what its agent turns spent (tickets/budgets.py).
# Nullable columns and constant defaults: no table rewrite, and the previous
# release's admissions (which name only the old columns) go on inserting.

from decimal import Decimal

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tickets', '0005_schedules'),
    ]

    operations = [
        migrations.AddField(
            model_name='trace',
            name='budget',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='trace',
            name='spent_tokens',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='trace',
            name='spent_cost',
            field=models.DecimalField(db_default=Decimal('0'), decimal_places=6, default=0, max_digits=20),
        ),
        migrations.AddField(
            model_name='trace',
            name='budget_warned_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='trace',
            name='exhausted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='trace',
            name='exhausted_reason',
            field=models.CharField(blank=True, db_default='', default='', max_length=16),
        ),
        migrations.AddIndex(
            model_name='trace',
            index=models.Index(condition=models.Q(('budget__isnull', False), ('exhausted_at__isnull', True)), fields=['created_at'], name='trace_budget_open'),
        ),
    ]
