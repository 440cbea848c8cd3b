"""The dashboard."""

from __future__ import annotations

from ..selectors import dashboard as selectors
from .common import login_required, page


@login_required
def dashboard(request):
    context = selectors.dashboard_page(user=request.user, span=request.GET.get("range"))
    return page(
        request, "console/dashboard.html", {"section": "dashboard", **context}, region="live"
    )
