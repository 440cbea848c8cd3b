"""The workers page (``/workers``): every registered worker and its slots,
held slots and starved endpoints flagged, what each consumes, and staff's
"stop consuming" / "resume consuming" of the turns queue. Staff only: it
names hosts and process ids; anyone else gets 404, as for a page that is
not there."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from core.errors import DomainError
from recovery import services as recovery_services
from runtime import services as runtime_services
from runtime.models import WorkerEvent
from runtime.selectors import workers_overview

from .views import _case_for_owner, login_required, page

# The queue staff may stop a worker consuming: turns. The control queue runs
# the sweeps that keep every budget, so the console offers no switch for it.
DRAINABLE_QUEUE = "turns"


def _with_last_consumer_event(overview: dict) -> dict:
    """Each worker's newest stop or resume of its consuming (who, why)."""
    names = [w["name"] for w in overview["workers"]]
    latest: dict[str, WorkerEvent] = {}
    for event in WorkerEvent.objects.filter(worker__in=names).order_by("id"):
        latest[event.worker] = event  # the newest wins
    for w in overview["workers"]:
        w["last_consumer_event"] = latest.get(w["name"])
        w["drainable"] = DRAINABLE_QUEUE in w["queues"]
        w["consumes_turns"] = DRAINABLE_QUEUE in w["consuming"]
    return overview


@login_required
def worker_list(request):
    if not request.user.is_staff:
        raise Http404("not found")
    return page(
        request,
        "console/worker_list.html",
        {"section": "workers", **_with_last_consumer_event(workers_overview())},
        region="workers",
    )


@login_required
@require_POST
def worker_consuming(request, name):
    """Staff's stop or resume of a worker's consuming of the turns queue
    (runtime.services.set_worker_consuming: Celery's cancel_consumer /
    add_consumer to that worker, and a WorkerEvent with who and why)."""
    if not request.user.is_staff:
        raise Http404("not found")
    consume = request.POST.get("action") == "resume"
    try:
        _, answered = runtime_services.set_worker_consuming(
            worker=name,
            queue=DRAINABLE_QUEUE,
            consume=consume,
            user=request.user,
            reason=request.POST.get("reason", ""),
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        if not answered:
            messages.warning(
                request,
                f"{name} did not answer within 2 s (lost, or the broker is away): recorded, "
                "but nothing changed that the worker confirmed.",
            )
        elif consume:
            messages.success(request, f"{name} consumes {DRAINABLE_QUEUE} again.")
        else:
            messages.success(
                request,
                f"{name} takes no new turn; the turns it runs finish.",
            )
    return redirect("worker_list")


@login_required
@require_POST
def case_stop_process(request, case_id):
    """The owner's "stop the process" (recovery.services.stop_process)."""
    case = _case_for_owner(request, case_id)
    try:
        recovery_services.stop_process(
            case_id=case.id, user=request.user, rationale=request.POST.get("rationale")
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, "Stop requested: the worker on that host stops its process.")
    return redirect("case_detail", case_id=case.id)
