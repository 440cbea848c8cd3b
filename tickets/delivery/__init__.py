"""Delivery of a root ticket's answer to its requester (DESIGN.md flow 5).

Modules: ``states`` (the state machine below: open, approve, acknowledge),
``signing`` (Standard Webhooks headers, the retry schedule), ``sending``
(one attempt: claim, the URL policy again, the pinned send of
core/outbound.py, the record), ``sweep`` (due deliveries re-published).

Done is not delivered: a terminal root ticket gets one ``Delivery`` row (its id
is the stable ``webhook-id``) and a ``delivery_state`` of its own, which never
changes the ticket's work state.

Delivery state edges (``Ticket.delivery_state``)::

    none              -> awaiting_approval | pending   the terminal move (claimcheck_ticket_owes)
    awaiting_approval -> pending                       approve_ticket (an owner)
    pending|attempted -> attempted                     a webhook attempt failed, retry later
    pending|attempted -> delivered                     a 2xx answer, or a pull acknowledgement
    pending|attempted -> failed                        410 Gone, the URL policy refuses the
                                                       target at send time, or the attempts
                                                       ran out
    failed            -> delivered                     a late 2xx from an attempt whose lease
                                                       had run out: the receiver has it

The ``Delivery`` row carries the retry schedule. ``next_attempt_at`` is not
null exactly when a webhook send is owed (or claimed, see ``send``); the sweep
reads it through the partial index ``delivery_due_idx``.

Lock order: ``Ticket`` before ``Delivery``. No lock is held across DNS or HTTP.
"""

from __future__ import annotations

from .sending import Sent, send
from .signing import backoff_s, signed_headers, signer
from .states import acknowledge, approve_ticket, validate_webhook_url
from .sweep import sweep_due_deliveries

__all__ = [
    "Sent",
    "acknowledge",
    "approve_ticket",
    "backoff_s",
    "send",
    "signed_headers",
    "signer",
    "sweep_due_deliveries",
    "validate_webhook_url",
]
