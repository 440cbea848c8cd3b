"""Agent framework runners (runner kind ``agent``): one adapter module per
framework over one protocol (``protocol.py``), the memory of an endpoint
(``memory.py``) and the runner that ties a turn to them (``runner.py``).

A tool that has side effects declares it (Pydantic AI: ``metadata={"side_effect":
True}``; Agents SDK and LangGraph: a tool named in the runner's
``side_effect_tools``) and reads its idempotency key with
:func:`idempotency_key` while it runs (and, in a re-run of a call whose end
nobody saw, that call's key with :func:`idempotency_key_in_doubt`).
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

from endpoints.runner_spec import AGENT_ADAPTERS

# framework name (the runner's ``framework``) -> the module holding its
# ADAPTER: the directory validates the name (endpoints/runner_spec.py).
ADAPTERS = AGENT_ADAPTERS

_idempotency_key: ContextVar[str | None] = ContextVar("claimcheck_idempotency_key", default=None)
_turn_id: ContextVar[str | None] = ContextVar("claimcheck_turn_id", default=None)
# This turn's side-effecting calls that carry a key in doubt: their own
# idempotency key -> the key of the original's call that has no end (set
# per turn by the runner, filled by its tool hooks).
_in_doubt: ContextVar[dict[str, str] | None] = ContextVar("claimcheck_in_doubt", default=None)


def derive_key(turn_id: str, call_id: str) -> str:
    return "cc-" + hashlib.sha256(f"{turn_id}:{call_id}".encode()).hexdigest()[:40]


def idempotency_key(call_id: str | None = None) -> str | None:
    """The idempotency key of a side-effecting tool call: derived from the
    exact turn and the call id (send it to the system you change, so a
    repeat of this call is recognised). A re-run an owner authorises is a
    new turn and gets a new key. Pydantic AI tools call it with no argument
    (the call being run); Agents SDK tools pass ``ctx.tool_call_id``. None
    outside an agent turn."""
    if call_id is None:
        return _idempotency_key.get()
    turn = _turn_id.get()
    return derive_key(turn, call_id) if turn else None


def idempotency_key_in_doubt(call_id: str | None = None) -> str | None:
    """In a re-run (or retry) of a ticket whose turn ended while a call of
    this same tool had no end: that call's idempotency key, which the
    system this tool changes may already have seen. Send it beside
    :func:`idempotency_key` so a repeat is recognised; None when no call is
    in doubt. Called as :func:`idempotency_key` is."""
    key = idempotency_key(call_id)
    doubts = _in_doubt.get()
    return doubts.get(key) if key and doubts else None
