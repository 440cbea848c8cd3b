"""A Pydantic AI agent on a scripted offline model for the stream tests:
its prompt is ``steps <gate dir> <n>``; it calls the tool ``step`` n times,
one call a model response, and says ``done <n>``. Step 2 waits until the
file ``<gate dir>/open`` exists (the test's signal), so a test can act
while the turn is known to be in the middle of its tools."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

GATE_TIMEOUT_S = 60.0


def _prompt(messages: list[ModelMessage]) -> tuple[str, int]:
    """The last prompt, and how many ``step`` calls returned since it."""
    returned = 0
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        prompts = [p.content for p in message.parts if isinstance(p, UserPromptPart)]
        if prompts:
            return str(prompts[-1]), returned
        returned += sum(isinstance(p, ToolReturnPart) for p in message.parts)
    return "", returned


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt, returned = _prompt(messages)
    verb, _, rest = prompt.partition(" ")
    if verb != "steps":
        return ModelResponse(parts=[TextPart(f"echo: {prompt}")])
    gate, _, n = rest.strip().rpartition(" ")
    if returned < int(n):
        i = returned + 1
        return ModelResponse(parts=[ToolCallPart("step", {"i": i, "gate": gate})])
    return ModelResponse(parts=[TextPart(f"done {n}")])


def build() -> Agent:
    agent = Agent(FunctionModel(model), output_type=str, name="steps.agent")

    @agent.tool_plain
    async def step(i: int, gate: str) -> dict:
        """One step; the second waits for the test's gate file."""
        if i == 2:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not (Path(gate) / "open").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the test never opened the gate")
                await asyncio.sleep(0.05)
        return {"step": i}

    return agent
