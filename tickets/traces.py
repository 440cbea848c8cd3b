"""Who may add to a trace: the trace an admission joins on a caller's behalf.

A caller may add a ticket to an existing trace only if it may see a ticket
already in it (``selectors.visible_tickets``: its submitter, the endpoint's
owners, staff). To anyone else the trace does not exist: the admission
starts a trace of the caller's own instead, and the ticket keeps what the
caller asked for as a link (``requester.trace_link``). Were it a 404, the
answer would tell the caller that a trace by that name exists, and anyone
could lock an owner out of its own trace ids by using them first; as it is,
a stranger's tickets never count against another's circuit breaker, and the
number it may admit before a 429 is its own trace's, revealing nothing.

The caller's own trace is ``private_trace_id``: the same for the same
caller and name, so its tickets posted under one name stay one trace (and
one breaker) of its own; derived with ``SECRET_KEY``, so nobody else can
name it before it exists.

A ``parent`` needs no check here: admission already answers 404 for a parent
the caller may not see, and a child joins its parent's trace.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from .admission import validate_trace_id
from .models import Ticket
from .selectors import visible_tickets


@dataclass(frozen=True)
class TraceChoice:
    """The trace id to admit into (None: admission starts a new one) and,
    when it is not the one asked for, the link the ticket keeps."""

    trace_id: str | None
    link: dict[str, str] | None = None


def private_trace_id(user, requested: str) -> str:
    """The caller's own trace for a name it may not use: 32 hex digits (its
    own W3C form), keyed by ``SECRET_KEY`` so it cannot be guessed."""
    message = f"claimcheck.trace:{user.pk}:{requested}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()[:32]


def _joinable(user, trace_id: str) -> bool:
    """The trace is new, or ``user`` may see a ticket in it (each probe an
    index lookup on ``ticket_trace_idx``)."""
    if not Ticket.objects.filter(trace_id=trace_id).exists():
        return True
    return visible_tickets(user).filter(trace_id=trace_id).exists()


def _lock(trace_id: str) -> None:
    """Serialise admissions that name this trace id until the transaction
    ends. Without it two callers who see nothing of each other could both
    find the trace new and both start it: one trace, two tenants, one
    breaker. A transaction-level advisory lock (released at COMMIT, safe
    behind a transaction-mode pooler); unrelated ids that hash alike only
    wait for each other's admission."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"claimcheck.trace:{trace_id}"],
        )


def choose(user, *, requested: str, traceparent: str | None = None) -> TraceChoice:
    """Where an admission that names ``requested`` goes for ``user`` (call
    inside ``joining``'s transaction, which holds the lock)."""
    if user.is_staff or _joinable(user, requested):
        return TraceChoice(trace_id=requested)
    link = {"trace_id": requested, **({"traceparent": traceparent} if traceparent else {})}
    own = private_trace_id(user, requested)
    # Someone who saw one of this caller's tickets may have added to its
    # private trace; should even that be closed to it, start a fresh one.
    return TraceChoice(trace_id=own if _joinable(user, own) else None, link=link)


@contextmanager
def joining(
    user, *, requested: str | None, parent: Any = None, traceparent: str | None = None
) -> Iterator[TraceChoice]:
    """Decide the trace for one admission and hold it until the admission
    commits: run ``admit_ticket`` inside this block with the choice's
    ``trace_id``. Nothing to decide (no trace named, or a ``parent`` given,
    whose visibility admission checks) costs nothing: no transaction, no
    query, and the admission's one-statement fast path stays open."""
    if requested is None or parent is not None or user is None or not user.is_authenticated:
        yield TraceChoice(trace_id=requested)
        return
    validate_trace_id(requested)
    with transaction.atomic():
        _lock(requested)
        yield choose(user, requested=requested, traceparent=traceparent)


def counted(trace_id: str) -> int:
    """How many tickets the trace's circuit breaker counts: its row's count,
    or 1 for a trace a root opened alone, which has no row until a second
    ticket joins it (tickets/sql/claimcheck_admit_v2.sql); 0 for none."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT COALESCE((SELECT tr.tickets FROM tickets_trace tr WHERE tr.id = %(t)s),"
            " (SELECT count(*) FROM claimcheck_trace_opener(p_trace => %(t)s)))",
            {"t": trace_id},
        )
        return int(cur.fetchone()[0])
