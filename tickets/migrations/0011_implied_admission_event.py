# The admission event implied by the ticket row (docs/explanation/scale.md,
# "What an admission writes"): the admission stores the event's id (taken
# from the events' own sequence, so ids stay one sequence for the whole
# ledger) and its actor on the ticket, and writes no event row. The view
# tickets_ticketevent_all is what readers read (tickets.models.LedgerEvent):
# the rows, and one admission event for every ticket that implies one.
#
# For the previous release: two columns with constant defaults (no table
# rewrite), a view and a trigger it never touches. Its processes read
# tickets_ticketevent itself, which is why claimcheck_admit_v2 writes the
# event as a row while that release's claimcheck_admit is installed (until
# `post_deploy`).

from django.db import migrations, models
from django.db.models import deletion

VIEW = """
CREATE VIEW tickets_ticketevent_all AS
SELECT e.id, e.ticket_id, e.kind, e.from_state, e.to_state, e.actor, e.turn_id, e.detail, e.at
FROM tickets_ticketevent e
UNION ALL
-- The admission event as claimcheck_admit_v2 wrote it as a row: '' -> queued
-- at the ticket's creation, naming its parent if it has one.
SELECT t.admission_event, t.id, 'admitted', '', 'queued', t.admission_actor, NULL::uuid,
    CASE WHEN t.parent_id IS NULL THEN '{}'::jsonb
         ELSE jsonb_build_object('parent', t.parent_id::text) END,
    t.created_at
FROM tickets_ticket t
WHERE t.admission_event IS NOT NULL
"""

# An implied event is written once, like an event row (core/append_only.py):
# a change of its id or actor is refused. Only an UPDATE that names either
# column is looked at.
GUARD = """
CREATE FUNCTION claimcheck_admission_event_guard() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'ticket %: its admission event is written once', OLD.id
        USING ERRCODE = 'insufficient_privilege';
END
$fn$;
CREATE TRIGGER tickets_ticket_admission_event
    BEFORE UPDATE OF admission_event, admission_actor ON tickets_ticket FOR EACH ROW
    WHEN (OLD.admission_event IS DISTINCT FROM NEW.admission_event
          OR OLD.admission_actor IS DISTINCT FROM NEW.admission_actor)
    EXECUTE FUNCTION claimcheck_admission_event_guard();
"""

UNGUARD = """
DROP TRIGGER tickets_ticket_admission_event ON tickets_ticket;
DROP FUNCTION claimcheck_admission_event_guard();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tickets", "0010_retention_hold"),
    ]

    operations = [
        migrations.AddField(
            model_name="ticket",
            name="admission_event",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="ticket",
            name="admission_actor",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.RunSQL(VIEW, "DROP VIEW tickets_ticketevent_all"),
        migrations.RunSQL(GUARD, UNGUARD),
        migrations.CreateModel(
            name="LedgerEvent",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("kind", models.CharField(max_length=64)),
                ("from_state", models.CharField(blank=True, default="", max_length=16)),
                ("to_state", models.CharField(blank=True, default="", max_length=16)),
                ("actor", models.CharField(blank=True, default="", max_length=200)),
                ("detail", models.JSONField(blank=True, default=dict)),
                ("at", models.DateTimeField()),
                (
                    "ticket",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=deletion.DO_NOTHING,
                        related_name="+",
                        to="tickets.ticket",
                    ),
                ),
                (
                    "turn",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=deletion.DO_NOTHING,
                        related_name="+",
                        to="tickets.turn",
                    ),
                ),
            ],
            options={
                "db_table": "tickets_ticketevent_all",
                "ordering": ["id"],
                "managed": False,
            },
        ),
    ]
