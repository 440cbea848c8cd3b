from django.core.management.base import BaseCommand, CommandError

from accounts.keys import revoke_api_key
from accounts.models import ApiKey


class Command(BaseCommand):
    help = (
        "Revoke the API key with PREFIX (the part after 'cc_'). Running web processes "
        "stop accepting it within API_KEY_CACHE_S."
    )

    def add_arguments(self, parser):
        parser.add_argument("prefix")

    def handle(self, *args, prefix, **options):
        if not ApiKey.objects.filter(prefix=prefix).exists():
            raise CommandError(f"no API key with prefix {prefix}")
        if revoke_api_key(prefix):
            self.stdout.write(f"revoked key {prefix}")
        else:
            self.stdout.write(f"key {prefix} was already revoked")
