from pathlib import Path

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from core.sqlfunctions import installer


class EndpointsConfig(AppConfig):
    name = "endpoints"

    def ready(self) -> None:
        # A turn's start and finish and the lock's release (endpoints/sql/),
        # after every migrate.
        post_migrate.connect(
            installer(Path(__file__).parent / "sql"),
            sender=self,
            weak=False,
            dispatch_uid="endpoints-sql",
        )
        # What tickets needs about endpoints (tickets/ports.py): the arrow
        # between the apps points endpoints -> tickets only.
        from tickets.ports import EndpointDirectory, provide_endpoint_directory

        from . import ports, runtime, selectors

        provide_endpoint_directory(
            EndpointDirectory(
                resolve=selectors.resolve_endpoint,
                may_submit=selectors.may_submit,
                is_owner=selectors.is_owner,
                owned_ids=selectors.owned_endpoint_ids,
                is_quarantined=selectors.is_quarantined,
                rejects_when_busy=selectors.rejects_when_busy,
                is_locked=selectors.is_locked,
                open_case_id=ports.open_case_id,
                request_interrupt=runtime.request_interrupt,
            )
        )
