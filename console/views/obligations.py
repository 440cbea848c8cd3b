"""The open obligations list. An owner manages one from its ticket's page
(views/tickets.py)."""

from __future__ import annotations

from django.urls import reverse

from ..selectors import obligations as selectors
from .common import login_required, page


@login_required
def obligation_list(request):
    cursor = request.GET.get("cursor", "").strip() or None
    context = selectors.obligation_list_page(user=request.user, cursor=cursor)
    return page(
        request,
        "console/obligation_list.html",
        {"section": "obligations", "first_page": reverse("obligation_list"), **context},
        region="table",
        status=400 if context["error"] else 200,
    )
