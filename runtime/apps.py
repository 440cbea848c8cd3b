from pathlib import Path

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.sqlfunctions import installer


class RuntimeConfig(AppConfig):
    name = "runtime"

    def ready(self) -> None:
        # A turn's start and finish, the lock's release and the next ticket
        # (runtime/sql/), after every migrate.
        post_migrate.connect(
            installer(Path(__file__).parent / "sql"),
            sender=self,
            weak=False,
            dispatch_uid="runtime-sql",
        )
        # The "interrupt" busy policy's request, which admission (below the
        # runtime) makes after its commit.
        from tickets import superseding

        from .turns import supersede_turn

        superseding.register(supersede_turn)
