"""A Pydantic AI agent on a local FunctionModel that answers with the
instructions its model request carried: the agent's own and the endpoint
generation's notes."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel


def _model(messages, info):
    return ModelResponse(parts=[TextPart(messages[-1].instructions or "")])


agent = Agent(FunctionModel(_model), output_type=str, instructions="You are the notes agent.")
