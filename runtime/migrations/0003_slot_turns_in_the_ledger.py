# A slot's turn is the ledger's record now (tickets/migrations/0009: the
# turn names the pool process that runs it, and when that process let go of
# it): the start and the finish write it on the turn's row, and the worker
# registry reads it there (runtime/selectors.py).
#
# runtime_workerslot.turn_id leaves the model only: the previous release's
# workers still write it while they run beside this one (upgrades migrate
# first and drop nothing the previous release uses: docs/howto/upgrade.md).
#
# The turns running while this migrates keep their slot: each slot's turn
# is copied onto the turn's row, so the registry of this release shows them
# and a stop's check before its kill finds them.

from django.db import migrations

BACKFILL = """
UPDATE runtime_turn u
   SET slot = w.name || ':' || s.pid
  FROM runtime_workerslot s
  JOIN runtime_worker w ON w.id = s.worker_id
 WHERE s.turn_id = u.id AND u.slot IS NULL AND u.released_at IS NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0002_ticket_links"),
        ("tickets", "0009_turn_slot"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.RemoveField(model_name="workerslot", name="turn")],
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
