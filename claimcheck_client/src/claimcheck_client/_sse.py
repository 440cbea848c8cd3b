"""Server-Sent Events for ``stream()`` without I/O: the parser, what it
yields, and ``Resume``, one call's state across its connections. The sync
and async clients run the same few lines of I/O around ``Resume``; every
decision (which header, which retry, how long to wait) is made here, once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ._retry import Attempts, RetryPolicy
from .models import Event

# A read that gets nothing for this long (the server's heartbeat is 15 s)
# is a dead connection: the client reconnects.
READ_TIMEOUT_S = 45.0
# A stream that ends sooner than this without a step is reconnected after a
# backoff (a server that cannot hold streams now), not at once.
QUICK_END_S = 1.0


@dataclass(frozen=True)
class Step:
    """One message of a ticket's stream: a ledger event (``id`` its event
    id, ``event`` the parsed row), a transient ``delta`` (no id), or the
    final ``end`` (``data["state"]``: the ticket's terminal state)."""

    kind: str
    id: int | None
    data: dict[str, Any]

    @property
    def event(self) -> Event | None:
        return Event.from_json(self.data) if self.id is not None else None

    @property
    def is_end(self) -> bool:
        return self.kind == "end"


class Parser:
    """Feed it lines (without their newline); it returns a ``Step`` when a
    blank line ends a message with data. Comments (``: keep-alive``) and
    ``retry:`` are skipped."""

    def __init__(self) -> None:
        self._kind = "message"
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Step | None:
        if line == "":
            if not self._data:
                self._kind, self._id = "message", None
                return None
            step = Step(
                kind=self._kind,
                id=int(self._id)
                if self._id and self._id.isascii() and self._id.isdigit()
                else None,
                data=json.loads("\n".join(self._data)),
            )
            self._kind, self._id, self._data = "message", None, []
            return step
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self._kind = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            self._id = value
        return None


class Resume:
    """One ``stream()`` call across its connections. The caller's loop:
    ``request()`` for each connection's headers; an answer that is not the
    stream to ``on_response``, a dropped connection to
    ``on_transport_error`` (each a wait, or its typed error raised); each
    line to ``feed`` (a ``Step`` or None; ``done`` after ``end``); a stream
    that ended without ``end`` (the server's STREAM_MAX_S) to ``on_close``,
    the wait before resuming from ``Last-Event-ID``."""

    def __init__(
        self,
        policy: RetryPolicy,
        last_event_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy, self.clock = policy, clock
        self.attempts = Attempts(policy)
        self.last = last_event_id
        self.done = False
        self.quiet = 0  # connections in a row that ended at once without a step
        self._parser, self._opened, self._got = Parser(), 0.0, False

    def request(self) -> dict[str, str]:
        """A new connection's headers."""
        self._parser, self._opened, self._got = Parser(), self.clock(), False
        headers = {"Accept": "text/event-stream"}
        if self.last is not None:
            headers["Last-Event-ID"] = str(self.last)
        return headers

    def feed(self, line: str) -> Step | None:
        step = self._parser.feed(line)
        if step is not None:
            self.attempts, self._got = Attempts(self.policy), True  # it answers: a fresh budget
            self.last = step.id if step.id is not None else self.last
            self.done = step.is_end
        return step

    def on_response(self, response: httpx.Response) -> float:
        """An error answer (its body read): the wait before asking again,
        or its typed error (``NotFound`` for a stranger's ticket) raised."""
        delay = self.attempts.on_response(response)
        if delay is None:
            self.attempts.finish(response)
        return delay or 0.0

    def on_transport_error(self, exc: httpx.TransportError) -> float:
        delay = self.attempts.on_transport_error(exc)
        if delay is None:
            raise self.attempts.raise_transport(exc) from exc
        return delay

    def on_close(self) -> float:
        """A stream that ended without ``end``: resume at once, or after a
        backoff when it ended at once with nothing (never a tight loop)."""
        quick = not self._got and self.clock() - self._opened < QUICK_END_S
        self.quiet = self.quiet + 1 if quick else 0
        return self.policy.backoff(self.quiet - 1) if self.quiet else 0.0
