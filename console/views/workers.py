"""The workers page (``/workers``): every registered worker and its slots,
held slots and starved endpoints flagged, what each consumes, and staff's
"stop consuming" / "resume consuming" of the turns queue. Staff only: it
names hosts and process ids; anyone else gets 404, as for a page that is
not there."""

from __future__ import annotations

from django.contrib import messages
from django.urls import reverse
from django.views.decorators.http import require_POST

from runtime import services as runtime_services

from ..selectors import workers as selectors
from .common import act, login_required, page


@login_required
def worker_list(request):
    return page(
        request,
        "console/worker_list.html",
        {"section": "workers", **selectors.worker_page(user=request.user)},
        region="workers",
    )


@login_required
@require_POST
def worker_consuming(request, name):
    """Staff's stop or resume of a worker's consuming of the turns queue
    (runtime.services.set_worker_consuming: Celery's cancel_consumer /
    add_consumer to that worker, and a WorkerEvent with who and why)."""
    selectors.require_workers_page(request.user)
    consume = request.POST.get("action") == "resume"
    queue = selectors.DRAINABLE_QUEUE

    def done(result):
        _, answered = result
        if not answered:
            return messages.WARNING, (
                f"{name} did not answer within 2 s (lost, or the broker is away): recorded, "
                "but nothing changed that the worker confirmed."
            )
        if consume:
            return f"{name} consumes {queue} again."
        return f"{name} takes no new turn; the turns it runs finish."

    def refused(detail):
        messages.error(request, detail)
        return worker_list(request)

    return act(
        request,
        lambda: runtime_services.set_worker_consuming(
            worker=name,
            queue=queue,
            consume=consume,
            user=request.user,
            reason=request.POST.get("reason", ""),
        ),
        done=done,
        refused=refused,
        then=reverse("worker_list"),
    )
