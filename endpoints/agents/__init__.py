"""Agent framework runners (runner kind ``agent``): one adapter module per
framework over one protocol (``protocol.py``), the memory of an endpoint
(``memory.py``) and the runner that ties a turn to them (``runner.py``).

A tool that has side effects declares it (Pydantic AI: ``metadata={"side_effect":
True}``; Agents SDK: a tool named in the runner's ``side_effect_tools``) and
reads its idempotency key with :func:`idempotency_key` while it runs.
"""

from __future__ import annotations

from contextvars import ContextVar

# framework name (the runner's ``framework``) -> the module holding its ADAPTER.
ADAPTERS = {
    "pydantic_ai": "endpoints.agents.pydanticai",
    "openai_agents": "endpoints.agents.openaiagents",
}

_idempotency_key: ContextVar[str | None] = ContextVar("claimcheck_idempotency_key", default=None)


def idempotency_key() -> str | None:
    """Inside a side-effecting tool call: the key derived from the exact
    turn and the call id (send it to the system you change, so a repeat of
    this call is recognised). A re-run an owner authorises is a new turn
    and gets a new key. None outside such a call."""
    return _idempotency_key.get()
