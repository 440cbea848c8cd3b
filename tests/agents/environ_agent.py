"""A Pydantic AI agent on a local FunctionModel that answers with what its
turn's process holds: its user, its model key's digest (the secret its
runner names), the worker's variables it can see."""

from __future__ import annotations

import hashlib
import json
import os

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel


def _model(messages, info):
    key = os.environ.get("CC_AGENT_MODEL_KEY", "")
    seen = {
        "uid": os.getuid(),
        "key_sha": hashlib.sha256(key.encode()).hexdigest() if key else None,
        "worker_env": sorted({"DATABASE_URL", "SECRET_KEY"} & set(os.environ)),
    }
    return ModelResponse(parts=[TextPart(json.dumps(seen))])


agent = Agent(FunctionModel(_model), output_type=str, name="environ")
