"""A trace's page."""

from __future__ import annotations

from ..selectors import traces as selectors
from .common import login_required, page


@login_required
def trace_detail(request, trace_id):
    context = selectors.trace_page(trace_id, user=request.user)
    return page(
        request, "console/trace_detail.html", {"section": "tickets", **context}, region="tree"
    )
