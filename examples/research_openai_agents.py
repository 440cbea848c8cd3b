"""A small research agent with two sub-agents, on the OpenAI Agents SDK.

The same shape as ``research_pydantic_ai.py``: ``researcher`` calls the
``delegate`` tool (the adapter adds it) for ``examples.oai-search`` and
``examples.oai-summarize`` in one response; the callbacks resume it.

Offline by default (a local fake ``Model``). With ``EXAMPLE_MODEL`` set
(e.g. ``gpt-4o-mini``) the agents use that model; the SDK reads
``OPENAI_API_KEY``, which the runner's ``secrets`` supplies from a named
secret. ``examples/run_research.py`` runs it end to end.
"""

from __future__ import annotations

import json
import os
import uuid

from agents import Agent
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

SEARCH, SUMMARIZE = "examples.oai-search", "examples.oai-summarize"


def _say(text: str) -> ModelResponse:
    content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
    message = ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )
    return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)


def _prompt(items) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            content = item.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class _Offline(Model):
    def __init__(self, answer) -> None:
        self.answer = answer

    async def get_response(self, system_instructions, input, *args, **kwargs):
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        return self.answer(items)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("offline model: no streaming")


def _researcher(items) -> ModelResponse:
    if items[-1].get("type") == "function_call_output":
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        return _say("Brief: " + "; ".join(outputs[-2:]))
    topic = _prompt(items)
    calls = [
        ResponseFunctionToolCall(
            id=f"fc_{n}",
            type="function_call",
            call_id=f"call_{uuid.uuid4().hex[:12]}",
            name="delegate",
            arguments=json.dumps({"endpoint": endpoint, "input": {"prompt": topic}}),
        )
        for n, endpoint in enumerate((SEARCH, SUMMARIZE))
    ]
    return ModelResponse(output=calls, usage=Usage(requests=1), response_id=None)


def _model(offline):
    return os.environ.get("EXAMPLE_MODEL") or _Offline(offline)


def researcher() -> Agent:
    return Agent(
        name="researcher",
        instructions=(
            f"Research the user's topic: call delegate twice in one response, once with "
            f"endpoint {SEARCH!r} and once with {SUMMARIZE!r}, each with input "
            '{"prompt": <the topic>}; then write a three-line brief from their answers.'
        ),
        model=_model(_researcher),
    )


def searcher() -> Agent:
    return Agent(
        name="searcher",
        instructions="List three sources.",
        model=_model(lambda items: _say(f"3 sources on {_prompt(items)!r}")),
    )


def summarizer() -> Agent:
    return Agent(
        name="summarizer",
        instructions="Summarise in one line.",
        model=_model(lambda items: _say(f"{_prompt(items)} in one line")),
    )
