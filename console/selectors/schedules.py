"""The endpoint page's schedules panel: each schedule of the endpoint with
its next fire times and its recent slots' tickets. Its owners and staff only
(``tickets.schedules.visible_schedules`` decides)."""

from __future__ import annotations

from typing import Any

from endpoints.models import Endpoint
from tickets import schedules
from tickets.models import Ticket

# Schedules and slots the panel shows (the API has them all).
PANEL_SCHEDULES = 20
PANEL_SLOTS = 5


def endpoint_schedules(endpoint: Endpoint, *, user) -> list[dict[str, Any]]:
    found = list(
        schedules.visible_schedules(user)
        .filter(endpoint=endpoint)
        .order_by("created_at", "id")[:PANEL_SCHEDULES]
    )
    rows = []
    for schedule in found:
        rows.append(
            {
                "schedule": schedule,
                "next": schedules.next_fire_times(schedule),
                "slots": schedules.recent_slots(schedule, limit=PANEL_SLOTS),
            }
        )
    # The slots' tickets' states in one query (a pruned ticket has none).
    ids = [s.ticket_id for row in rows for s in row["slots"] if s.ticket_id]
    states = dict(Ticket.objects.filter(id__in=ids).values_list("id", "state")) if ids else {}
    for row in rows:
        row["slots"] = [{"slot": s, "ticket_state": states.get(s.ticket_id)} for s in row["slots"]]
    return rows
