"""The runtime's MCP tool (config/mcp.py, docs/reference/mcp.md): a ticket's cancel,
which interrupts a running ticket's turn. As the ticket tools
(tickets/mcp.py), it calls the very route handler the API calls (the
ledger's, tickets/api.py)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from core.tools import Tool
from tickets import api
from tickets.mcp import TicketIdIn
from tickets.schemas import TicketOut


def cancel(request: HttpRequest, params: TicketIdIn) -> dict[str, Any]:
    return api.cancel(request, params.ticket_id)


TOOLS = [
    Tool(
        name="cancel_ticket",
        title="Cancel a ticket",
        description="Cancel a ticket (POST /api/v1/tickets/{id}/cancel): a queued or waiting "
        "one is cancelled at once; a running one is asked to stop and changes state when its "
        "turn stops. A finished ticket is invalid_transition.",
        params=TicketIdIn,
        output=TicketOut,
        run=cancel,
        read_only=False,
        destructive=True,
        idempotent=False,
    ),
]
