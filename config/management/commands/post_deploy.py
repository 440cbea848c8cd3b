"""`post_deploy`: the step of an upgrade that runs once every process of the
previous release has stopped (docs/howto/upgrade.md): it drops the
database functions the release retired (each app's ``sql/RETIRED``), which
the previous release's processes may still have called until then. Connects
as the owner role when DATABASE_MIGRATE_URL is set, as `migrate` does."""

from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections

from core.db_roles import connect_as
from core.sqlfunctions import drop_retired, retired


class Command(BaseCommand):
    help = (
        "After an upgrade, once no process of the previous release runs: drop the database "
        "functions this release retired (each app's sql/RETIRED)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--check", action="store_true", help="list what would be dropped; drop nothing"
        )

    def handle(self, *args, check: bool = False, **options):
        connection = connections[DEFAULT_DB_ALIAS]
        if settings.DATABASE_MIGRATE_URL:
            connect_as(connection, settings.DATABASE_MIGRATE_URL)
        for app in apps.get_app_configs():
            folder = Path(app.path) / "sql"
            if not folder.is_dir():
                continue
            if check:
                for signature in retired(folder):
                    self.stdout.write(f"{app.label}: would drop {signature} (if installed)")
                continue
            for signature in drop_retired(connection, folder):
                self.stdout.write(f"{app.label}: dropped {signature}")
        self.stdout.write("post_deploy: done")
