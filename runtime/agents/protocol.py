"""The one protocol every agent framework adapter implements.

The runtime side (``runtime/agents/runner.py``) owns everything that is
Claimcheck's: which exchange a turn belongs to, the conversation loaded from
the endpoint's history, the answers to pending calls (children's results,
owners' approvals), the child tickets, the artifacts, the receipts. An
adapter owns only the framework: it turns an ``AgentTurn`` into one run of
the framework's agent and reports an ``AgentStep``. Messages cross the
boundary as the framework's own JSON (each adapter serialises and parses
its messages), so the runtime stores and orders them without knowing what
they are. A third framework (LangGraph, say) is one more module with one
``Adapter`` in it, named in ``ADAPTERS`` (``runtime/agents/__init__.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from core.canonical import canonical_json

# The tool every adapter gives its agent: ``delegate(endpoint, input)``.
DELEGATE_TOOL = "delegate"


@dataclass
class Answer:
    """The answer to one pending call of a waiting exchange.

    ``result``: the child succeeded, ``value`` is its result. ``error``: the
    child failed, was cancelled or orphaned: ``value`` says so, and the agent
    gets it as a failed tool result (never an invented success).
    ``approved`` / ``denied``: an owner's decision on a call that needed
    approval, with the owner's ``reason``."""

    kind: Literal["result", "error", "approved", "denied"]
    value: Any = None
    reason: str = ""


@dataclass
class Delegation:
    """A ``delegate`` call the agent made: one child ticket."""

    call_id: str
    endpoint: str
    input: dict[str, Any]


@dataclass
class ApprovalRequest:
    """A call of a tool that requires approval: the turn ends waiting for an owner."""

    call_id: str
    tool: str
    args: Any


@dataclass
class ToolHooks:
    """What the runtime gives an adapter for tool calls.

    ``started`` / ``ended`` write the receipts (through the supervisor, as
    the call happens); ``idempotency_key(call_id)`` is the key a
    side-effecting tool gets: derived from the exact turn and the call, so a
    re-run an owner authorises (a new turn) gets a new one."""

    started: Callable[[str, str, Any, bool], str | None]
    ended: Callable[[str, str, str, float, Any], None]
    idempotency_key: Callable[[str], str]


@dataclass
class AgentTurn:
    """One turn of an agent, in framework-neutral terms."""

    # The user's input for a new exchange; None when the turn resumes one.
    prompt: str | None
    # Earlier exchanges, oldest first: each a list of the framework's message JSON.
    history: list[list[Any]]
    # The resumed exchange's messages so far (None for a new exchange).
    resumed: list[Any] | None
    # The framework's own state saved when the exchange started waiting
    # (the Agents SDK's RunState), or None.
    state: Any
    # Pending call id -> answer, when resuming.
    answers: dict[str, Answer]
    hooks: ToolHooks
    # The turn's input as given (an adapter may pass it on as dependencies).
    input: dict[str, Any] = field(default_factory=dict)
    # The endpoint's runner settings (e.g. ``side_effect_tools``).
    options: dict[str, Any] = field(default_factory=dict)
    # The endpoint generation's notes for the next run: an adapter adds them
    # to the agent's instructions for this run.
    notes: str = ""


@dataclass
class AgentStep:
    """What one run of the agent did."""

    # This turn's new messages, the framework's JSON, in order.
    messages: list[Any]
    # The final output (JSON-able) when the exchange is complete.
    output: Any = None
    done: bool = True
    delegations: list[Delegation] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)
    # Framework state to keep for the resumption (JSON-able), or None.
    state: Any = None
    # {"requests": n, "input_tokens": n, "output_tokens": n, "model"?: name, ...} when reported.
    usage: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    """One agent framework."""

    framework: str

    def check(self, agent: Any) -> None:
        """Raise ``TypeError`` when ``agent`` is not this framework's agent."""

    async def run(self, agent: Any, turn: AgentTurn) -> AgentStep:
        """Run the agent once: a new exchange from ``turn.prompt``, or the
        resumed one with ``turn.answers``. Must end at its next await when
        cancelled (the runtime cancels the task on an interrupt)."""


def notes_instructions(notes: str) -> str | None:
    """The generation's notes as a block of instructions (None: no notes)."""
    text = (notes or "").strip()
    if not text:
        return None
    return "Notes for this run from the endpoint's owners (follow them):\n" + text


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value, default=str)).hexdigest()


async def cancellable(coro, interrupt, seen: dict[str, float] | None = None) -> Any:
    """Run ``coro`` as a task cancelled at its next await once ``interrupt``
    (a threading or multiprocessing event) is set; ``seen["at"]`` is when
    it was (``time.monotonic()``)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()

    def watch() -> None:
        interrupt.wait()
        if seen is not None:
            seen["at"] = time.monotonic()
        # The run may have ended (and its loop closed) meanwhile.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=watch, daemon=True, name="agent-interrupt").start()
    return await task
