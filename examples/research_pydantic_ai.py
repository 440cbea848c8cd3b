"""A small research agent with two sub-agents, on Pydantic AI.

``researcher`` delegates to ``examples.pai-search`` and
``examples.pai-summarize`` (each an agent endpoint of its own) in one model
response; the turn ends ``waiting``, and when both children's callbacks are
in, the researcher writes its brief from their answers.

Offline by default (``FunctionModel``: deterministic, no key). With
``EXAMPLE_MODEL`` set (e.g. ``openai:gpt-4o-mini``) each agent uses that
model instead; its key comes from a named secret through the runner's
``secrets`` (``{"OPENAI_API_KEY": "EXAMPLE_OPENAI_KEY"}``), never from the
runner itself. ``examples/run_research.py`` runs it end to end.
"""

from __future__ import annotations

import os

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

SEARCH, SUMMARIZE = "examples.pai-search", "examples.pai-summarize"


def _prompt(messages) -> str:
    for message in reversed(messages):
        for part in getattr(message, "parts", []):
            if part.part_kind == "user-prompt" and isinstance(part.content, str):
                return part.content
    return ""


def _researcher_model(messages, info) -> ModelResponse:
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returns:
        found = "; ".join(f"{r.content}" for r in returns)
        return ModelResponse(parts=[TextPart(f"Brief: {found}")])
    topic = _prompt(messages)
    return ModelResponse(
        parts=[
            ToolCallPart("delegate", {"endpoint": SEARCH, "input": {"prompt": topic}}),
            ToolCallPart("delegate", {"endpoint": SUMMARIZE, "input": {"prompt": topic}}),
        ]
    )


def _model(offline):
    name = os.environ.get("EXAMPLE_MODEL")
    return name if name else FunctionModel(offline)


def researcher() -> Agent:
    return Agent(
        _model(_researcher_model),
        output_type=str,
        instructions=(
            f"Research the user's topic: call delegate twice in one response, once with "
            f"endpoint {SEARCH!r} and once with {SUMMARIZE!r}, each with input "
            '{"prompt": <the topic>}; then write a three-line brief from their answers.'
        ),
    )


def searcher() -> Agent:
    def offline(messages, info):
        return ModelResponse(parts=[TextPart(f"3 sources on {_prompt(messages)!r}")])

    return Agent(_model(offline), output_type=str, instructions="List three sources.")


def summarizer() -> Agent:
    def offline(messages, info):
        return ModelResponse(parts=[TextPart(f"{_prompt(messages)} in one line")])

    return Agent(_model(offline), output_type=str, instructions="Summarise in one line.")
