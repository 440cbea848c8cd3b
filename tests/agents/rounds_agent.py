"""A Pydantic AI agent on a scripted offline model for the tests of several
rounds of pending calls in one exchange.

Its prompt is ``steps <step> | <step> | ...``; each step is one round:
``delegate a, b`` (children on demo.echo; ``delegate fail`` on demo.fail),
``delegate-to <address> <text>`` or ``send <to>`` (a tool that requires
approval). When every step has had its answers it says ``done: `` and
every answer of the exchange in order. Any other prompt is echoed."""

from __future__ import annotations

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

from runtime.agents import idempotency_key


def _exchange(messages: list[ModelMessage]) -> tuple[str, list[ModelMessage]]:
    """This exchange's prompt and its messages from the prompt on."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, ModelRequest):
            prompts = [p.content for p in message.parts if isinstance(p, UserPromptPart)]
            if prompts:
                return str(prompts[-1]), messages[i:]
    return "", messages


def _calls(step: str) -> list[ToolCallPart]:
    verb, _, rest = step.strip().partition(" ")
    rest = rest.strip()
    if verb == "delegate-to":  # delegate-to <address> <item>
        target, _, item = rest.partition(" ")
        return [ToolCallPart("delegate", {"endpoint": target, "input": {"text": item}})]
    if verb == "delegate":
        target = "demo.fail" if rest.startswith("fail") else "demo.echo"
        items = [i.strip() for i in rest.split(",") if i.strip()] or ["hello"]
        return [
            ToolCallPart("delegate", {"endpoint": target, "input": {"text": item}})
            for item in items
        ]
    if verb == "send":
        return [ToolCallPart("send_report", {"to": rest or "owner"})]
    raise ValueError(f"unknown step {step!r}")


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt, mine = _exchange(messages)
    verb, _, rest = prompt.partition(" ")
    if verb != "steps":
        return ModelResponse(parts=[TextPart(f"echo: {prompt}")])
    steps = [s for s in rest.split("|") if s.strip()]
    rounds = sum(
        1
        for m in mine
        if isinstance(m, ModelResponse) and any(isinstance(p, ToolCallPart) for p in m.parts)
    )
    if rounds < len(steps):
        return ModelResponse(parts=_calls(steps[rounds]))
    said = [
        f"{p.tool_name}: {p.content}"
        for m in mine
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    return ModelResponse(parts=[TextPart("done: " + "; ".join(said))])


def build() -> Agent:
    agent = Agent(FunctionModel(model), output_type=str, name="rounds")

    @agent.tool_plain(requires_approval=True, metadata={"side_effect": True})
    def send_report(to: str) -> str:
        """Send the report (needs an owner's approval)."""
        return f"sent to {to} with key {idempotency_key()}"

    return agent
