"""A ticket's steps as Server-Sent Events (``GET /tickets/{id}/stream``).

Every ledger event of the ticket (state changes, tool receipts, usage) is
one message: ``id:`` the event's id, ``event:`` its kind, ``data:`` the JSON
of ``GET /tickets/{id}/events``' items. The ledger is the stream's only
source, so a client that reconnects with ``Last-Event-ID`` (or connects
after the turn ended) is sent what it missed, then the live tail. Once the
ticket is terminal and its events are sent, a final ``event: end`` closes
the stream.

New events are waited for on the web process's one LISTEN thread
(tickets/waits.py: every event wakes its ticket's waiters after commit), so
a stream costs no query and holds no database session while nothing
happens; while that listener is down it reads every ``FALLBACK_POLL_S``.
A comment every ``STREAM_HEARTBEAT_S`` keeps proxies from closing an idle
stream. A stream holds a web thread, so it is bounded: by a slot
(core/fairshare.py ``stream_slot``: the process's wait slots and the
user's ``RATE_LIMIT_CONCURRENT_STREAMS``) and by ``STREAM_MAX_S``, after
which it ends without ``end`` and the client resumes by its last id.

Event ids are a global sequence, taken at insert: two transactions that
append to one ticket at once (a turn's tool receipt and an interrupt
request) may commit out of id order. A stream therefore re-reads the ids
above what it sent in the last ``SETTLE_S`` and sends any it has not: on
one connection an event is sent exactly once, even a late one. (A client
that reconnects inside that window could still miss an event that
commits late below its last id; ``GET /tickets/{id}/events`` is complete.)

Visibility is checked once, when the stream opens (the route's 404).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import StreamingHttpResponse

from core.transient import TRANSIENT_ERRORS, describe, drop_broken_connection

from . import selectors, waits
from .models import TERMINAL_STATES, LedgerEvent, Ticket

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
# Ids sent this recently are re-read for a late commit below them.
SETTLE_S = 5.0
# What a browser's EventSource waits before reconnecting (ms).
RETRY_MS = 1000
# While the wake-up listener is down, a stream reads its ticket this often.
FALLBACK_POLL_S = 1.0


def message(*, event: str, data: object, id: int | None = None) -> bytes:  # noqa: A002
    """One SSE message. ``data`` is JSON on one line (no newline can end
    the message early)."""
    head = f"id: {id}\n" if id is not None else ""
    body = json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"))
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


HEARTBEAT = b": keep-alive\n\n"


class _Cursor:
    """What this connection has sent: every id above ``floor`` it has sent,
    each dropped (and the floor raised to it) ``SETTLE_S`` after."""

    def __init__(self, after: int) -> None:
        self.floor = after
        self.sent: set[int] = set()
        self.recent: deque[tuple[float, int]] = deque()
        self.last = after  # the highest id read: the wait's token

    def unsent(self, ticket_id: uuid.UUID) -> list[LedgerEvent]:
        now = time.monotonic()
        while self.recent and now - self.recent[0][0] > SETTLE_S:
            _, settled = self.recent.popleft()
            self.floor = max(self.floor, settled)
            self.sent.discard(settled)
        self.sent = {i for i in self.sent if i > self.floor}
        # The ids first (an index-only read of the ticket's posting list, and
        # its row for the admission event it implies), the rows only of
        # those not sent yet (by ticket too: an implied event has no index
        # of its own).
        ids = LedgerEvent.objects.filter(ticket_id=ticket_id, id__gt=self.floor).values_list(
            "id", flat=True
        )
        new = [i for i in ids if i not in self.sent]
        if not new:
            return []
        self.last = max(self.last, *new)
        return list(LedgerEvent.objects.filter(ticket_id=ticket_id, id__in=new).order_by("id"))

    def mark(self, event_id: int) -> None:
        self.sent.add(event_id)
        self.recent.append((time.monotonic(), event_id))


def _latest_id(ticket_id: uuid.UUID) -> str:
    newest = (
        LedgerEvent.objects.filter(ticket_id=ticket_id)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return str(newest or 0)


def steps(ticket_id: uuid.UUID, *, after: int) -> Iterator[bytes]:
    """The stream's messages: the events after ``after``, the live tail,
    ``end`` once the ticket is terminal; it returns (no ``end``) after
    ``STREAM_MAX_S`` or on a transient fault, and the client resumes."""
    deadline = time.monotonic() + settings.STREAM_MAX_S
    heartbeat_s = max(0.1, settings.STREAM_HEARTBEAT_S)
    cursor = _Cursor(after)
    yield f"retry: {RETRY_MS}\n\n".encode()
    try:
        while True:
            # The state before the events: a terminal state read here has
            # its transition's event among those read next.
            state = Ticket.objects.values_list("state", flat=True).get(id=ticket_id)
            for event in cursor.unsent(ticket_id):
                yield message(event=event.kind, data=selectors.event_payload(event), id=event.id)
                cursor.mark(event.id)
            if state in TERMINAL_STATES:
                yield message(event="end", data={"state": state})
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            woke = waits.wait_for_change(
                str(ticket_id),
                str(cursor.last),
                lambda: _latest_id(ticket_id),
                min(heartbeat_s, left),
            )
            if woke is None:  # no listener (a database restart): read a while later
                if not connection.in_atomic_block:
                    connection.close()
                time.sleep(min(FALLBACK_POLL_S, left))
            elif not woke[1]:
                yield HEARTBEAT
    except Ticket.DoesNotExist:  # pruned while streamed (tickets/retention.py)
        log.info("ticket %s: stream ended, the ticket is gone", ticket_id)
    except TRANSIENT_ERRORS as exc:
        drop_broken_connection()
        log.warning("ticket %s: stream ended by a transient fault (%s)", ticket_id, describe(exc))


class _Body:
    """The response's content: ``steps``, and ``release`` when the server
    closes the response, whether or not it was ever iterated (a generator
    never started runs no ``finally``)."""

    def __init__(self, messages: Iterator[bytes], release: Callable[[], None]) -> None:
        self._messages = messages
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        return self._messages

    def close(self) -> None:
        try:
            self._messages.close()  # type: ignore[attr-defined]
        finally:
            self._release()


def response(
    ticket_id: uuid.UUID, *, after: int, release: Callable[[], None]
) -> StreamingHttpResponse:
    """The stream's response; ``release`` frees its slot when it is closed."""
    out = StreamingHttpResponse(
        _Body(steps(ticket_id, after=after), release), content_type=MEDIA_TYPE
    )
    out["Cache-Control"] = "no-cache"
    # nginx (deploy/nginx.conf) buffers answers; a stream must pass at once.
    out["X-Accel-Buffering"] = "no"
    return out
