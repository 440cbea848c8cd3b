"""``python manage.py audit_ledger [--json] [--since WHEN] [--limit N]``: check
the ledger's invariants (recovery/audit.py); exit 1 naming each violation."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from recovery.audit import DEFAULT_LIMIT, KINDS, audit_ledger

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or a span back from now
    (``90s``, ``15m``, ``2h``, ``7d``)."""
    relative = _RELATIVE.match(value.strip())
    if relative:
        amount, unit = relative.groups()
        return timezone.now() - timedelta(**{_UNITS[unit]: float(amount)})
    try:
        moment = parse_datetime(value.strip())
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"--since {value!r}: give an ISO 8601 time or a span like 15m, 2h, 7d")
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment


class Command(BaseCommand):
    help = (
        "Check the ledger's invariants (no overlapping turns, fencing tokens in order, "
        "results only from the exact turn, no replays, live turns and cases behind running "
        "and recovering tickets, one open case per quarantine, one callback per source, no "
        "stranded queued ticket, events agreeing with states). Exits 1 naming each violation."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="print the report as JSON"
        )
        parser.add_argument(
            "--since",
            help="only tickets, turns and callbacks created since (ISO time, or 15m / 2h / 7d)",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=DEFAULT_LIMIT,
            help=f"violations listed per kind (all are counted; default {DEFAULT_LIMIT})",
        )
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="the database alias to audit"
        )
        parser.add_argument(
            "--in-flight-s",
            type=float,
            default=None,
            help="how recent a dispatch must be to count as in flight (default REDISPATCH_AFTER_S)",
        )

    def handle(self, *args, as_json, since, limit, in_flight_s, database, **options):
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        report = audit_ledger(
            since=parse_since(since) if since else None,
            limit=limit,
            in_flight_s=in_flight_s,
            using=database,
        )
        if as_json:
            self.stdout.write(_dumps(report.as_dict()))
        else:
            scope = f" since {report.since.isoformat()}" if report.since else ""
            if report.ok:
                self.stdout.write(
                    f"ledger audit{scope}: clean ({len(KINDS)} invariants, {report.seconds:.2f} s)"
                )
            for violation in report.violations:
                self.stdout.write(violation.line())
        if not report.ok:
            summary = ", ".join(f"{kind} {n}" for kind, n in sorted(report.counts.items()))
            raise CommandError(
                f"ledger audit: {sum(report.counts.values())} violation(s): {summary}",
                returncode=1,
            )


def _dumps(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)
