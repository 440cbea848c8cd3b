from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "endpoints"

    def ready(self) -> None:
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
