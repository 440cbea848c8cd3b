"""``python manage.py check_runners``: list the endpoints whose runner does not
fit its kind's schema (endpoints/runner_spec.py: an unknown field, a literal
credential), and the endpoint events that recorded such a runner; exit 1 if
there is any. Names fields, never values.

Run it before and after upgrading to the strict runner schema. Such a runner
is not run (its turns fail ``runner_invalid``) until staff replace it with
``PATCH /api/v1/endpoints/{address}`` (``{"runner": ...}``, secrets by name).
Events are append-only: one that recorded a literal credential keeps it, so
the command says which credentials to rotate.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from endpoints import runner_spec
from endpoints.models import Endpoint, EndpointEvent


def _runners_in(detail: dict) -> list[object]:
    """The runner dicts an event's detail records (``created``: ``runner``;
    ``runner_changed``: ``from`` and ``to``)."""
    if not isinstance(detail, dict):
        return []
    found = [detail.get("runner")]
    found += [detail.get("from"), detail.get("to")]
    return [r for r in found if isinstance(r, dict) and "kind" in r]


class Command(BaseCommand):
    help = (
        "List endpoints whose runner has unknown fields or literal credentials, and the "
        "endpoint events that recorded such runners; exit 1 if there is any."
    )

    def handle(self, *args, **options):
        bad = 0
        for endpoint in Endpoint.objects.order_by("address").only("id", "address", "runner"):
            problem = runner_spec.problem(endpoint.runner)
            if problem:
                bad += 1
                self.stdout.write(f"endpoint {endpoint.address}: {problem}")
        events = EndpointEvent.objects.filter(kind__in=("created", "runner_changed"))
        for event in events.select_related("endpoint").order_by("id").iterator():
            for runner in _runners_in(event.detail):
                problem = runner_spec.problem(runner)
                if problem:
                    bad += 1
                    self.stdout.write(
                        f"event {event.id} ({event.kind} on {event.endpoint.address}, "
                        f"{event.at:%Y-%m-%d %H:%M:%SZ}) recorded a runner at fault: {problem}; "
                        "if it held a credential, rotate it (events are append-only)"
                    )
                    break
        if bad:
            raise CommandError(f"{bad} runner record(s) do not fit the runner schema")
        self.stdout.write("every runner fits its kind's schema")
