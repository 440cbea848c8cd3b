"""``manage.py prune_ledger --older-than DAYS [--dry-run] [--batch N]``: the
retention rule of tickets/retention.py, in batches."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tickets import retention


class Command(BaseCommand):
    help = (
        "Delete whole traces whose tickets all finished more than DAYS ago, with their "
        "events, turns, deliveries and attempts; never open obligations, pending work "
        "or anything a recovery case refers to."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="DAYS",
            help="cutoff in days (at least 1; default: RETENTION_DAYS)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--batch", type=int, default=500, help="traces per transaction")

    def handle(self, *args, older_than, dry_run, batch, **options):
        days = older_than if older_than is not None else settings.RETENTION_DAYS
        if not days:
            raise CommandError("give --older-than DAYS (RETENTION_DAYS is 0: retention is off)")
        try:
            report = retention.prune(older_than_days=days, batch=batch, dry_run=dry_run)
        except (ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        verb = "would delete" if dry_run else "deleted"
        counts = ", ".join(f"{v} {k}" for k, v in report.counts.items())
        self.stdout.write(
            f"finished before {report.cutoff}: {verb} {counts} ({report.batches} batch(es))"
        )
