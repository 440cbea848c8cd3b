from django.core.management.base import BaseCommand

from accounts.keys import create_api_key


class Command(BaseCommand):
    help = "Create an API key for USERNAME (creating the user if missing); prints the key last."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")
        parser.add_argument("--staff", action="store_true", help="make the user staff")

    def handle(self, *args, username, name, staff, **options):
        row, key = create_api_key(username=username, name=name, staff=staff)
        self.stderr.write(f"created key {row.prefix} for {username}{' (staff)' if staff else ''}")
        self.stdout.write(key)
