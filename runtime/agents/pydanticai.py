"""The Pydantic AI adapter (``framework: "pydantic_ai"``; needs the optional
dependency group ``pydantic-ai``).

- Memory: the conversation is the endpoint's history, parsed with
  ``ModelMessagesTypeAdapter`` and given as ``message_history``; the turn's
  ``new_messages()`` are what it stores.
- Delegation: a ``delegate(endpoint, input)`` tool raises ``CallDeferred``;
  the run ends with ``DeferredToolRequests`` (several calls in one model
  response are several children) and the resumed run gets the children's
  results as ``DeferredToolResults.calls`` (a failed child as ``ToolFailed``).
- Approvals: a tool declared ``requires_approval=True`` ends the run in
  ``DeferredToolRequests.approvals``; the owner's decision comes back as
  ``ToolApproved`` or ``ToolDenied`` with the reason.
- Receipts: a capability wraps every tool execution (``wrap_tool_execute``)
  and reports its start and end; a tool with ``metadata={"side_effect":
  True}`` runs with its idempotency key set (``runtime.agents.idempotency_key``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ToolFailed
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.toolsets import FunctionToolset
from pydantic_core import to_jsonable_python

from core.canonical import canonical_json

from . import _idempotency_key
from .protocol import (
    DELEGATE_TOOL,
    AgentStep,
    AgentTurn,
    ApprovalRequest,
    Delegation,
    ToolHooks,
    notes_instructions,
)


async def delegate(endpoint: str, input: dict[str, Any]) -> Any:  # noqa: A002 - the tool's API
    """Ask another Claimcheck endpoint to do part of the work. `endpoint` is its
    address, `input` the JSON object it takes. The answer arrives later as
    this call's result (or an error if that work failed)."""
    raise CallDeferred(metadata={"claimcheck": DELEGATE_TOOL})


class _Receipts(AbstractCapability):
    """A receipt when each tool call starts and when it ends."""

    def __init__(self, hooks: ToolHooks) -> None:
        self.hooks = hooks

    async def wrap_tool_execute(self, ctx, *, call, tool_def, args, handler):
        side_effect = bool((tool_def.metadata or {}).get("side_effect"))
        key = self.hooks.started(
            call.tool_name, call.tool_call_id, call.args_as_dict(), side_effect
        )
        token = _idempotency_key.set(key)
        began = time.monotonic()
        try:
            result = await handler(args)
        except (CallDeferred, ApprovalRequired):
            self.hooks.ended(call.tool_name, call.tool_call_id, "deferred", _since(began), None)
            raise
        except asyncio.CancelledError:
            self.hooks.ended(call.tool_name, call.tool_call_id, "cancelled", _since(began), None)
            raise
        except Exception as exc:
            self.hooks.ended(
                call.tool_name,
                call.tool_call_id,
                "error",
                _since(began),
                {"error": f"{type(exc).__name__}: {exc}"},
            )
            raise
        finally:
            _idempotency_key.reset(token)
        self.hooks.ended(
            call.tool_name, call.tool_call_id, "ok", _since(began), to_jsonable_python(result)
        )
        return result


def _since(began: float) -> float:
    return time.monotonic() - began


def _results(turn: AgentTurn) -> DeferredToolResults | None:
    if not turn.answers:
        return None
    calls: dict[str, Any] = {}
    approvals: dict[str, Any] = {}
    for call_id, answer in turn.answers.items():
        if answer.kind == "result":
            calls[call_id] = answer.value
        elif answer.kind == "error":
            calls[call_id] = ToolFailed(
                "the delegated work did not succeed: " + canonical_json(answer.value).decode()
            )
        elif answer.kind == "approved":
            approvals[call_id] = ToolApproved()
        else:
            approvals[call_id] = ToolDenied(
                f"an owner denied this call: {answer.reason}" if answer.reason else "denied"
            )
    return DeferredToolResults(calls=calls, approvals=approvals)


def _output_types(agent: Agent) -> list[Any]:
    declared = agent.output_type
    types = list(declared) if isinstance(declared, list | tuple) else [declared]
    if DeferredToolRequests not in types:
        types.append(DeferredToolRequests)
    return types


class PydanticAIAdapter:
    framework = "pydantic_ai"
    _warm = False

    def warm(self) -> None:
        """Build pydantic's schemas for messages, tools and runs once in the
        supervising worker (a throwaway run on a local model): each turn's
        forked process inherits them instead of building them again (about
        a second a turn)."""
        if self._warm:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            # An event loop runs in this thread (a host embedding the runtime
            # in async code): asyncio.run cannot; the turn's process warms.
            return
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel

        def model(messages, info):
            if len(messages) == 1:
                return ModelResponse(parts=[ToolCallPart("noop", {"x": 1})])
            return ModelResponse(parts=[TextPart("ok")])

        agent = Agent(FunctionModel(model), output_type=str)

        @agent.tool_plain
        def noop(x: int) -> int:
            return x

        hooks = ToolHooks(
            started=lambda *a: None, ended=lambda *a: None, idempotency_key=lambda c: ""
        )
        turn = AgentTurn(
            prompt="warm", history=[], resumed=None, state=None, answers={}, hooks=hooks
        )
        step = asyncio.run(self.run(agent, turn))
        ModelMessagesTypeAdapter.validate_python(step.messages)
        self._warm = True

    def check(self, agent: Any) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"a pydantic_ai.Agent is needed, not {type(agent).__name__}")

    async def run(self, agent: Agent, turn: AgentTurn) -> AgentStep:
        history = [m for exchange in turn.history for m in exchange] + (turn.resumed or [])
        result = await agent.run(
            turn.prompt,
            message_history=ModelMessagesTypeAdapter.validate_python(history) if history else None,
            deferred_tool_results=_results(turn),
            toolsets=[FunctionToolset([delegate])],
            output_type=_output_types(agent),
            capabilities=[_Receipts(turn.hooks)],
            # The generation's notes, beside the agent's own instructions.
            instructions=notes_instructions(turn.notes),
        )
        messages = ModelMessagesTypeAdapter.dump_python(result.new_messages(), mode="json")
        usage = result.usage
        # The model that answered last: its price counts the run's cost
        # against the trace's budget (tickets/budgets.py, MODEL_PRICES).
        model = next((m["model_name"] for m in reversed(messages) if m.get("model_name")), None)
        step = AgentStep(
            messages=messages,
            usage={
                "requests": usage.requests,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "tool_calls": usage.tool_calls,
                **({"model": model} if model else {}),
            },
        )
        output = result.output
        if not isinstance(output, DeferredToolRequests):
            step.output = to_jsonable_python(output)
            return step
        step.done = False
        for call in output.calls:
            if call.tool_name != DELEGATE_TOOL:
                raise RuntimeError(
                    f"tool {call.tool_name!r} deferred its call: only delegate and approvals "
                    "are answered by Claimcheck"
                )
            args = call.args_as_dict()
            step.delegations.append(
                Delegation(
                    call_id=call.tool_call_id,
                    endpoint=args.get("endpoint"),
                    input=args.get("input"),
                )
            )
        for call in output.approvals:
            step.approvals.append(
                ApprovalRequest(
                    call_id=call.tool_call_id, tool=call.tool_name, args=call.args_as_dict()
                )
            )
        return step


ADAPTER = PydanticAIAdapter()
