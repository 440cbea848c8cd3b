"""A Pydantic AI agent on an offline model whose one tool has a side
effect, for the tests of a turn process that dies mid-call.

``charge <dir>`` calls ``charge(dir)``: the tool writes what it was given
(its process, its idempotency key and the key in doubt) to
``<dir>/<key>.json``, the downstream system's record, and then waits a
minute unless its key in doubt says this is the repeat of a call whose
end nobody saw. ``boom`` names an agent factory that raises before any
turn can report (``broken``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.agents import idempotency_key, idempotency_key_in_doubt


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(f"charged: {returns[0].content}")])
    prompt = str(messages[-1].parts[-1].content)
    verb, _, rest = prompt.partition(" ")
    if verb == "charge":
        return ModelResponse(parts=[ToolCallPart("charge", {"where": rest.strip()})])
    return ModelResponse(parts=[TextPart(f"echo: {prompt}")])


def build() -> Agent:
    agent = Agent(FunctionModel(model), output_type=str, name="doubt")

    @agent.tool_plain(metadata={"side_effect": True})
    async def charge(where: str) -> dict:
        """Charge the customer (a side effect a repeat must not double)."""
        key, doubt = idempotency_key(), idempotency_key_in_doubt()
        seen = {"pid": os.getpid(), "key": key, "in_doubt": doubt}
        Path(where, f"{key}.json").write_text(json.dumps(seen))
        if doubt is None:
            await asyncio.sleep(60)
        return seen

    return agent


def broken() -> Agent:
    return undefined_name  # noqa: F821 - the factory's own bug, on purpose
