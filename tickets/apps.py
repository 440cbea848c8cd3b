from pathlib import Path

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.sqlfunctions import installer


class TicketsConfig(AppConfig):
    name = "tickets"

    def ready(self) -> None:
        # The ledger's transition functions (tickets/sql/: admission, a turn's
        # start and finish, the lock's release, the next ticket, a delivery's
        # opening), after every migrate.
        post_migrate.connect(
            installer(Path(__file__).parent / "sql"),
            sender=self,
            weak=False,
            dispatch_uid="tickets-sql",
        )
