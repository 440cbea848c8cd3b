from django.core.management.base import BaseCommand, CommandError

from console.owners import create_owner
from core.errors import DomainError


class Command(BaseCommand):
    help = "Create (or update) a console user who owns the given endpoints."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--endpoint", action="append", default=[], dest="endpoints")

    def handle(self, *args, username, password, endpoints, **options):
        try:
            create_owner(username=username, password=password, endpoints=endpoints)
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"owner {username} of {', '.join(endpoints) or 'no endpoints'}")
