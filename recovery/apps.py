from pathlib import Path

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.sqlfunctions import installer


class RecoveryConfig(AppConfig):
    name = "recovery"

    def ready(self) -> None:
        # Recovery owns cases and their evidence; the runtime below asks for
        # them through its typed port (runtime/ports.py, CaseKeeper), which
        # the functions of recovery.services implement, so the import arrow
        # points recovery -> runtime only.
        from runtime.ports import provide_case_keeper

        from . import services

        provide_case_keeper(services)
        # Recovery's retention holds in the ledger (recovery/sql/: the
        # trigger that holds a case's and a decision's tickets), after
        # every migrate, with the other apps' functions.
        post_migrate.connect(
            installer(Path(__file__).parent / "sql"),
            sender=self,
            weak=False,
            dispatch_uid="recovery-sql",
        )
