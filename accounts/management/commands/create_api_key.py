from django.core.management.base import BaseCommand, CommandError

from accounts.keys import create_api_key


class Command(BaseCommand):
    help = "Create an API key for USERNAME (creating the user if missing); prints the key last."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")
        parser.add_argument("--staff", action="store_true", help="make the user staff")
        parser.add_argument(
            "--rate",
            default=None,
            metavar="SPEC",
            help="this key's own admissions per window, in RATE_LIMIT_ADMISSIONS's notation "
            "(e.g. '1000/second'; '' for none); the key is then counted apart from its user",
        )
        parser.add_argument(
            "--concurrent-requests",
            type=int,
            default=None,
            metavar="N",
            help="this key's own requests in flight (0 for none); the key is then counted "
            "apart from its user",
        )

    def handle(self, *args, username, name, staff, rate, concurrent_requests, **options):
        try:
            row, key = create_api_key(
                username=username,
                name=name,
                staff=staff,
                rate_limit_admissions=rate,
                rate_limit_concurrent_requests=concurrent_requests,
            )
        except ValueError as exc:
            raise CommandError(f"{exc}") from exc
        limits = []
        if rate is not None:
            limits.append(f"admissions {rate or 'unlimited'}")
        if concurrent_requests is not None:
            limits.append(f"{concurrent_requests or 'unlimited'} requests in flight")
        self.stderr.write(
            f"created key {row.prefix} for {username}{' (staff)' if staff else ''}"
            + (f", own limits: {', '.join(limits)}" if limits else "")
        )
        self.stdout.write(key)
