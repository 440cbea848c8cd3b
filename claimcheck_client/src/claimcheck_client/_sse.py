"""Server-Sent Events for ``stream()``: the parser and what it yields (no I/O
here; the sync and async loops live with the clients)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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
