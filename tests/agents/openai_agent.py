"""An OpenAI Agents SDK agent on a local fake ``Model`` (no network, no key)
for the adapter's tests: it answers like demo.agent (remember, recall,
delegate, send)."""

from __future__ import annotations

import json
import uuid

from agents import Agent, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from runtime.agents import idempotency_key


def _say(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )
    return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)


def _call(n: int, name: str, args: dict) -> ResponseFunctionToolCall:
    call_id = f"call_{uuid.uuid4().hex[:12]}_{n}"  # unique, like a real model's
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}",
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(args),
    )


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return " ".join(c.get("text", "") for c in content or [] if isinstance(c, dict))


def _step(step: str) -> ModelResponse:
    """One round of a ``steps`` prompt: ``delegate a, b``, ``delegate-to
    <address> <text>`` or ``send <to>``."""
    verb, _, rest = step.strip().partition(" ")
    rest = rest.strip()
    if verb == "delegate":
        target = "demo.fail" if rest.startswith("fail") else "demo.echo"
        parts = [i.strip() for i in rest.split(",") if i.strip()]
        calls = [
            _call(n, "delegate", {"endpoint": target, "input": {"text": p}})
            for n, p in enumerate(parts)
        ]
    elif verb == "delegate-to":
        target, _, item = rest.partition(" ")
        calls = [_call(0, "delegate", {"endpoint": target, "input": {"text": item}})]
    else:
        calls = [_call(0, "send_report", {"to": rest})]
    return ModelResponse(output=calls, usage=Usage(requests=1), response_id=None)


def _steps(prompt: str, mine: list) -> ModelResponse:
    """``steps <step> | <step> | ...``: each step one round of pending calls;
    when every step has its answers, ``done: `` and every answer in order."""
    steps = [s for s in prompt.partition(" ")[2].split("|") if s.strip()]
    asked = {i["call_id"] for i in mine if i.get("type") == "function_call"}
    # A round is a model response with calls: count the distinct responses
    # (the calls of one response share their position in the items).
    rounds, previous = 0, None
    for item in mine:
        kind = item.get("type")
        if kind == "function_call" and previous != "function_call":
            rounds += 1
        previous = kind
    if rounds < len(steps):
        return _step(steps[rounds])
    names = {i["call_id"]: i["name"] for i in mine if i.get("type") == "function_call"}
    said = [
        f"{names[o['call_id']]}: {o['output']}"
        for o in mine
        if o.get("type") == "function_call_output" and o["call_id"] in asked
    ]
    return _say("done: " + "; ".join(said))


class FakeModel(Model):
    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        last_prompt = max(i for i, item in enumerate(items) if item.get("role") == "user")
        if _text(items[last_prompt].get("content")).startswith("steps "):
            return _steps(_text(items[last_prompt].get("content")), items[last_prompt:])
        if items[-1].get("type") == "function_call_output":
            # This exchange's calls and outputs: the items after its prompt.
            last_prompt = max(i for i, item in enumerate(items) if item.get("role") == "user")
            mine = items[last_prompt:]
            calls = {i["call_id"]: i for i in mine if i.get("type") == "function_call"}
            said = [
                f"{calls[o['call_id']]['name']}: {o['output']}"
                for o in mine
                if o.get("type") == "function_call_output"
            ]
            return _say("results: " + "; ".join(said))
        prompts = [_text(i.get("content")) for i in items if i.get("role") == "user"]
        verb, _, rest = prompts[-1].partition(" ")
        if verb == "remember":
            return _say(f"noted: {rest}")
        if verb == "recall":
            noted = [p.partition(" ")[2] for p in prompts[:-1] if p.startswith("remember ")]
            return _say("I remember: " + "; ".join(noted))
        if verb == "delegate":
            target = "demo.fail" if rest.startswith("fail") else "demo.echo"
            parts = [i.strip() for i in rest.split(",") if i.strip()]
            calls = [
                _call(n, "delegate", {"endpoint": target, "input": {"text": p}})
                for n, p in enumerate(parts)
            ]
            return ModelResponse(output=calls, usage=Usage(requests=1), response_id=None)
        if verb == "instructions":
            return _say(f"instructions: {system_instructions}")
        if verb == "send":
            call = _call(0, "send_report", {"to": rest})
            return ModelResponse(output=[call], usage=Usage(requests=1), response_id=None)
        return _say(f"echo: {prompts[-1]}")

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the fake model does not stream")


@function_tool(needs_approval=True)
def send_report(ctx: ToolContext, to: str) -> str:
    """Send the report (needs an owner's approval)."""
    return f"sent to {to} with key {idempotency_key(ctx.tool_call_id)}"


def build() -> Agent:
    return Agent(name="fake", instructions="answer", model=FakeModel(), tools=[send_report])
