from django.apps import AppConfig


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
