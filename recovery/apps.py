from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"

    def ready(self) -> None:
        # Recovery owns cases and their evidence; the runtime asks for them
        # through this interface (endpoints/ports.py), so the import arrow
        # points recovery -> endpoints only.
        from endpoints.ports import CaseKeeper, provide_case_keeper

        from . import selectors, services

        provide_case_keeper(
            CaseKeeper(
                open_case_for_uncertain_turn=services.open_case_for_uncertain_turn,
                record_late_evidence=services.record_late_evidence,
                open_case_id=selectors.open_case_id,
                record_process_exit=services.record_process_exit,
                resolve_process_stop=services.resolve_process_stop,
                resolve_stale_stops=services.resolve_stale_stops,
            )
        )
