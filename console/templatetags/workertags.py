"""The case page's "stop the process" panel (console/views/cases.py handles the
POST): shown to the case's owners when the case is decided and a live worker
slot still runs its turn, with the stops already recorded."""

from __future__ import annotations

from django import template

from recovery.models import ProcessStop
from runtime.selectors import slot_holding

register = template.Library()


@register.inclusion_tag("console/_stop_process.html", takes_context=True)
def stop_process_form(context, case):
    slot = slot_holding(case.turn_id) if case.state != "open" else None
    stops = list(ProcessStop.objects.filter(case=case).order_by("created_at"))
    return {
        "case": case,
        "slot": slot,
        "stops": stops,
        # A stop the worker has not reported on: the panel says so (not that
        # the process still runs) and refreshes until the outcome is recorded.
        "pending": next((s for s in stops if s.outcome == "requested"), None),
        "stop_error": context.get("stop_error"),
        "csrf_token": context.get("csrf_token"),
    }
