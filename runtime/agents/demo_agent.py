"""The demo agent (``runtime.demo.agent``): a Pydantic AI agent on a
deterministic offline model, so the demo and the tests run with no network
and no key. ``runtime/demo.py`` documents what it answers."""

from __future__ import annotations

import asyncio
from typing import Any

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

from . import idempotency_key


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _answer_returns(returns: list[ToolReturnPart]) -> str:
    said = []
    for part in returns:
        if part.tool_name == "delegate":
            if getattr(part, "outcome", "success") == "success":
                said.append(f"ok {part.content!r}")
            else:
                said.append(f"failed ({part.content})")
        else:
            said.append(f"{part.tool_name}: {part.content}")
    return (
        "children said: " + "; ".join(said)
        if returns[0].tool_name == "delegate"
        else ("done: " + "; ".join(said))
    )


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(_answer_returns(returns))])
    prompts = _prompts(messages)
    prompt = prompts[-1].strip() if prompts else ""
    verb, _, rest = prompt.partition(" ")
    rest = rest.strip()
    if verb == "remember":
        earlier = len(prompts) - 1
        return ModelResponse(parts=[TextPart(f"noted: {rest} ({earlier} earlier prompts)")])
    if verb == "recall":
        noted = [_short(p.partition(" ")[2]) for p in prompts[:-1] if p.startswith("remember ")]
        return ModelResponse(parts=[TextPart("I remember: " + "; ".join(noted))])
    if verb in ("delegate", "delegate-slow"):
        items = [i.strip() for i in rest.split(",") if i.strip()] or ["hello"]
        target, extra = "demo.echo", {}
        if verb == "delegate-slow":
            target, extra = "demo.sleep", {"seconds": 2}
        elif rest.startswith("fail"):
            target = "demo.fail"
        return ModelResponse(
            parts=[
                ToolCallPart("delegate", {"endpoint": target, "input": {"text": item, **extra}})
                for item in items
            ]
        )
    if verb == "send":
        return ModelResponse(parts=[ToolCallPart("send_report", {"to": rest or "owner"})])
    if verb == "slow":
        return ModelResponse(parts=[ToolCallPart("slow", {"seconds": float(rest or 1)})])
    return ModelResponse(parts=[TextPart(f"echo: {prompt}")])


def build() -> Agent:
    agent = Agent(FunctionModel(model), output_type=str, name="demo.agent")

    @agent.tool_plain(requires_approval=True, metadata={"side_effect": True})
    def send_report(to: str) -> str:
        """Send the report to someone (needs an owner's approval)."""
        return f"sent to {to} with key {idempotency_key()}"

    @agent.tool_plain
    async def slow(seconds: float) -> dict[str, Any]:
        """Wait a while (an await the interrupt can cancel)."""
        await asyncio.sleep(seconds)
        return {"slept_s": seconds}

    return agent
