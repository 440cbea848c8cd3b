"""API keys, and the indexes the console's search and delivery filter read
on the ticket table:

- ticket_id_tail_idx: the id's last group (its last twelve characters, 48
  random bits of a UUIDv7) reversed, so a search by the id's tail, as the
  pages print it (``…36ada1f2``), is a prefix range scan; the search checks
  the whole tail on the rows it finds (tickets.selectors.find_tickets).
- ticket_delivery_idx: ``(delivery_state, id DESC)`` for the "awaiting
  approval / pending / failed" filter and the dashboard's approvals panel;
  partial: children have no delivery, and "delivered" (most finished roots)
  is common enough that walking the primary key finds a page of it at once.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


INDEXES = {
    "ticket_id_tail_idx": "(reverse(right(id::text, 12)) text_pattern_ops)",
    "ticket_delivery_idx": (
        "(delivery_state, id DESC) WHERE delivery_state NOT IN ('none', 'delivered')"
    ),
}


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('tickets', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiKey',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, default='', max_length=100)),
                ('prefix', models.CharField(max_length=16, unique=True)),
                ('key_hash', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to=settings.AUTH_USER_MODEL)),
            ],
        ),
        *[
            migrations.RunSQL(
                f"CREATE INDEX {name} ON tickets_ticket {spec}", f"DROP INDEX {name}"
            )
            for name, spec in INDEXES.items()
        ],
    ]
