"""What a live region watches (console/views/live.py): a ticket the user
may see, or the whole ledger, and the change token to compare."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.http import Http404

from tickets import selectors as ticket_selectors
from tickets import waits


def watched(ticket: str | None, *, user) -> tuple[str, Callable[[], str]]:
    """The NOTIFY key to wait on and how to read the current token: of one
    ticket (404 unless ``user`` may see it, as for an unknown id), or of
    the ledger when ``ticket`` is empty."""
    if not ticket:
        return waits.ANY, ticket_selectors.ledger_change_token
    try:
        ticket_id = uuid.UUID(ticket)
    except ValueError:
        raise Http404("ticket not found") from None
    if not ticket_selectors.visible_tickets(user).filter(id=ticket_id).exists():
        raise Http404("ticket not found")
    key = str(ticket_id)  # as the NOTIFY payload spells it
    return key, lambda: ticket_selectors.change_token(ticket_id)
