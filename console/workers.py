"""The workers page (``/workers``): every registered worker and its slots,
held slots and starved endpoints flagged. Staff only: it names hosts and
process ids; anyone else gets 404, as for a page that is not there."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from core.errors import DomainError
from endpoints.selectors import workers_overview
from recovery import services as recovery_services

from .views import _case_for_owner, login_required, page


@login_required
def worker_list(request):
    if not request.user.is_staff:
        raise Http404("not found")
    return page(
        request,
        "console/worker_list.html",
        {"section": "workers", **workers_overview()},
        region="workers",
    )


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
