"""The sweeps' last runs, for /health."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='SweepRun',
            fields=[
                ('name', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('last_finished_at', models.DateTimeField()),
            ],
        ),
    ]
