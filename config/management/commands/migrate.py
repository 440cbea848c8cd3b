"""`migrate`, connecting as the owner role when DATABASE_MIGRATE_URL is set
(docs/howto/production.md): web and workers keep DATABASE_URL, the
application role, which may not create or alter tables."""

from django.conf import settings
from django.core.management.commands import migrate
from django.db import DEFAULT_DB_ALIAS, connections

from core.db_roles import connect_as


class Command(migrate.Command):
    help = migrate.Command.help + " Connects with DATABASE_MIGRATE_URL when that is set."

    def handle(self, *args, **options):
        if settings.DATABASE_MIGRATE_URL and options["database"] == DEFAULT_DB_ALIAS:
            connect_as(connections[DEFAULT_DB_ALIAS], settings.DATABASE_MIGRATE_URL)
        return super().handle(*args, **options)
