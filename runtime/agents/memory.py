"""The endpoint's history as the agent's memory.

Each agent turn's new messages are one artifact, content-addressed
(``agents/<sha[:2]>/<sha>.json`` in the default storage), referenced from
that turn's ``ContextEntry`` (and the ticket's ``artifacts``) by a pointer
with ``role: "agent_messages"``. The pointer reaches the ledger only through
the finish of the exact turn (the same transaction that accepts its
outcome writes the ContextEntry), so a late or fenced turn's file is never
part of anyone's conversation.

An **exchange** is one conversation round: the turn of a ticket, and when
it waits (children, an approval) the turns that resume it. The pointer
carries the exchange (the ticket that started it) and whether it is
``done`` or ``waiting``. The conversation a turn sees:

1. the done exchanges, ordered by the turn that completed them, each whole
   and in turn order (another ticket that ran while one exchange waited
   comes before it: its exchange completed first);
2. exchanges still waiting are left out (their pending tool calls have no
   results yet) -- except the one this turn resumes, which comes last;
3. an exchange whose first turn (its own ticket's) is older than the
   entries a turn loads (``AGENT_HISTORY_MAX_ENTRIES``) is not whole: an
   earlier one is left out, the resumed one is an error (``agent_memory``);
4. whose they are: with the runner's ``memory`` ``per_submitter`` (the
   default) only the exchanges of the submitter whose exchange this turn
   runs (the submitter of its ticket, or of the exchange it resumes; an
   exchange is the submitter of its own ticket, its resumes included), so
   one submitter's words never reach another's conversation; ``shared``:
   every exchange;
5. the cap: the newest whole exchanges while the running total stays within
   ``AGENT_HISTORY_MAX_MESSAGES`` messages and ``AGENT_HISTORY_MAX_BYTES``
   bytes (the runner's ``history_max_messages`` / ``history_max_bytes`` may
   lower them); older exchanges are dropped whole, never cut. The resumed
   exchange is always kept, whatever its size.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from core.canonical import canonical_json

log = logging.getLogger(__name__)

ROLE = "agent_messages"
MEDIA_TYPE = "application/json"


class MemoryError_(Exception):  # noqa: N801 - not the builtin MemoryError
    """An artifact of the conversation is missing or does not match its digest."""


def store(
    *, framework: str, exchange: str, status: str, messages: list[Any], state: Any
) -> dict[str, Any]:
    """Write one turn's messages; return the pointer for the ContextEntry."""
    body = canonical_json(
        {"framework": framework, "exchange": exchange, "messages": messages, "state": state}
    )
    sha = hashlib.sha256(body).hexdigest()
    name = f"agents/{sha[:2]}/{sha}.json"
    # Content-addressed: a turn that repeats another's messages byte for
    # byte shares the file.
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(body))
    return {
        "uri": f"artifact://{name}",
        "sha256": sha,
        "bytes": len(body),
        "media_type": MEDIA_TYPE,
        "role": ROLE,
        "framework": framework,
        "exchange": exchange,
        "status": status,
        "messages": len(messages),
    }


def store_blob(body: bytes, *, folder: str = "receipts") -> dict[str, Any]:
    """A large tool argument or result, content-addressed; its pointer."""
    sha = hashlib.sha256(body).hexdigest()
    name = f"{folder}/{sha[:2]}/{sha}.json"
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(body))
    return {"uri": f"artifact://{name}", "sha256": sha, "bytes": len(body)}


def read(pointer: dict[str, Any]) -> dict[str, Any]:
    """The stored body of a pointer, checked against its digest."""
    uri = str(pointer.get("uri", ""))
    if not uri.startswith("artifact://"):
        raise MemoryError_(f"not an artifact: {uri!r}")
    name = uri.removeprefix("artifact://")
    try:
        with default_storage.open(name, "rb") as fh:
            body = fh.read()
    except OSError as exc:
        raise MemoryError_(f"conversation artifact {name} cannot be read: {exc}") from exc
    if hashlib.sha256(body).hexdigest() != pointer.get("sha256"):
        raise MemoryError_(f"conversation artifact {name} does not match its sha256")
    return json.loads(body)


def pointer_of(entry: dict[str, Any]) -> dict[str, Any] | None:
    for artifact in entry.get("artifacts") or []:
        if isinstance(artifact, dict) and artifact.get("role") == ROLE:
            return artifact
    return None


@dataclass
class Exchange:
    exchange: str
    pointers: list[dict[str, Any]]  # in turn order
    done: bool
    last_seq: int
    # Its first turn (the exchange's own ticket's) is among the entries read.
    whole: bool = False
    # The submitter of the exchange's own ticket (known once ``whole``).
    submitter: int | None = None

    @property
    def messages(self) -> int:
        return sum(int(p.get("messages", 0)) for p in self.pointers)

    @property
    def bytes(self) -> int:
        return sum(int(p.get("bytes", 0)) for p in self.pointers)


def exchanges(history: list[dict[str, Any]]) -> list[Exchange]:
    """The history's agent entries grouped by exchange, ordered by the turn
    that completed each (a waiting one by its latest turn)."""
    by_id: dict[str, Exchange] = {}
    for entry in sorted(history, key=lambda e: e["seq"]):
        pointer = pointer_of(entry)
        if pointer is None:
            continue
        ex = by_id.get(pointer["exchange"])
        if ex is None:
            ex = by_id[pointer["exchange"]] = Exchange(pointer["exchange"], [], False, 0)
        if ex.done:
            # A turn that ran on after its exchange completed (a late
            # callback) is not part of the conversation.
            continue
        ex.pointers.append(pointer)
        if entry.get("ticket") == ex.exchange:
            ex.whole, ex.submitter = True, entry.get("submitter")
        ex.last_seq = entry["seq"]
        ex.done = pointer.get("status") == "done"
    return sorted(by_id.values(), key=lambda e: e.last_seq)


def caps(runner: dict[str, Any]) -> tuple[int, int]:
    max_messages = settings.AGENT_HISTORY_MAX_MESSAGES
    max_bytes = settings.AGENT_HISTORY_MAX_BYTES
    if isinstance(runner.get("history_max_messages"), int):
        max_messages = min(max_messages, runner["history_max_messages"])
    if isinstance(runner.get("history_max_bytes"), int):
        max_bytes = min(max_bytes, runner["history_max_bytes"])
    return max_messages, max_bytes


def conversation(
    history: list[dict[str, Any]],
    *,
    resuming: str | None,
    runner: dict[str, Any],
    submitter: int | None = None,
) -> tuple[list[list[Any]], list[Any] | None, Any]:
    """(earlier exchanges' messages, the resumed exchange's messages, its
    saved framework state), following the policy in the module docstring;
    ``submitter``: the submitter of the ticket this turn runs."""
    all_exchanges = exchanges(history)
    resumed_ex = next((e for e in all_exchanges if e.exchange == resuming), None)
    if resumed_ex is not None:
        submitter = resumed_ex.submitter
    shared = runner.get("memory") == "shared"
    max_messages, max_bytes = caps(runner)
    kept: list[Exchange] = []
    messages = bytes_ = 0
    candidates = [e for e in all_exchanges if e.done and e.whole and e.exchange != resuming]
    for ex in reversed([e for e in candidates if shared or e.submitter == submitter]):
        if messages + ex.messages > max_messages or bytes_ + ex.bytes > max_bytes:
            break
        kept.append(ex)
        messages += ex.messages
        bytes_ += ex.bytes
    earlier = [_messages_of(ex)[0] for ex in reversed(kept)]
    if resuming is None:
        return earlier, None, None
    if resumed_ex is None:
        raise MemoryError_(f"exchange {resuming} has no messages in this endpoint's history")
    if not resumed_ex.whole:
        raise MemoryError_(
            f"exchange {resuming} began before the {len(history)} newest entries of this "
            "endpoint's history a turn reads (AGENT_HISTORY_MAX_ENTRIES)"
        )
    resumed, state = _messages_of(resumed_ex)
    return earlier, resumed, state


def _messages_of(ex: Exchange) -> tuple[list[Any], Any]:
    out: list[Any] = []
    state = None
    for pointer in ex.pointers:
        body = read(pointer)
        out.extend(body.get("messages") or [])
        state = body.get("state")
    return out, state
