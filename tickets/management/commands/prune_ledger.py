"""``manage.py prune_ledger --older-than DAYS [--dry-run] [--batch N]
[--pause-ratio R] [--max-seconds S]``: the retention rule of
tickets/retention.py, in batches."""

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
        parser.add_argument(
            "--batch",
            type=int,
            default=None,
            help="traces per transaction (default: RETENTION_BATCH)",
        )
        parser.add_argument(
            "--pause-ratio",
            type=float,
            default=None,
            metavar="R",
            help="after a batch of t seconds, pause R*t before the next, 0 to 10 "
            "(default: RETENTION_PAUSE_RATIO)",
        )
        parser.add_argument(
            "--max-seconds",
            type=float,
            default=None,
            metavar="S",
            help="stop after the batch that passes S seconds; the next run goes on",
        )

    def handle(self, *args, older_than, dry_run, batch, pause_ratio, max_seconds, **options):
        days = older_than if older_than is not None else settings.RETENTION_DAYS
        if not days:
            raise CommandError("give --older-than DAYS (RETENTION_DAYS is 0: retention is off)")
        try:
            report = retention.prune(
                older_than_days=days,
                batch=settings.RETENTION_BATCH if batch is None else batch,
                dry_run=dry_run,
                pause_ratio=settings.RETENTION_PAUSE_RATIO if pause_ratio is None else pause_ratio,
                max_s=max_seconds,
            )
        except (ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        verb = "would delete" if dry_run else "deleted"
        counts = ", ".join(f"{v} {k}" for k, v in report.counts.items())
        left = "" if report.complete else "; stopped with candidates left, run again"
        self.stdout.write(
            f"finished before {report.cutoff}: {verb} {counts} ({report.batches} batch(es), "
            f"paused {report.paused_s:.1f} s{left})"
        )
