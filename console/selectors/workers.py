"""The workers page: every registered worker and its slots, held slots and
starved endpoints, what each consumes and its newest stop or resume of its
consuming. Staff only (``runtime.selectors.sees_workers``): it names
hosts and process ids; anyone else gets 404, as for a page not there."""

from __future__ import annotations

from typing import Any

from django.http import Http404

from runtime.models import WorkerEvent
from runtime.selectors import sees_workers, workers_overview

# The queue staff may stop a worker consuming: turns. The control queue runs
# the sweeps that keep every budget, so the console offers no switch for it.
DRAINABLE_QUEUE = "turns"


def require_workers_page(user) -> None:
    """404 for anyone who may not see the workers."""
    if not sees_workers(user):
        raise Http404("not found")


def worker_page(*, user) -> dict[str, Any]:
    require_workers_page(user)
    overview = workers_overview()
    names = [w["name"] for w in overview["workers"]]
    latest: dict[str, WorkerEvent] = {}
    for event in WorkerEvent.objects.filter(worker__in=names).order_by("id"):
        latest[event.worker] = event  # the newest wins
    for w in overview["workers"]:
        w["last_consumer_event"] = latest.get(w["name"])
        w["drainable"] = DRAINABLE_QUEUE in w["queues"]
        w["consumes_turns"] = DRAINABLE_QUEUE in w["consuming"]
    return overview
