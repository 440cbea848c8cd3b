"""Delivery of a root ticket's answer to its requester (filled in by the delivery issue)."""

from __future__ import annotations

import uuid

from .models import Ticket


def validate_webhook_url(url: str) -> None:
    pass


def on_root_terminal(*, ticket: Ticket) -> None:
    pass


def approve_ticket(*, ticket_id: uuid.UUID, user) -> None:
    pass


def acknowledge(*, ticket_id: uuid.UUID, actor: str) -> None:
    pass
