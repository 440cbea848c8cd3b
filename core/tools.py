"""An MCP tool as an app declares it (``tickets/mcp.py``); the server at
``/mcp`` (config/mcp.py) collects every app's tools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from pydantic import BaseModel


@dataclass(frozen=True)
class Tool:
    """One MCP tool. ``params`` is a pydantic model: its JSON schema is the
    tool's input schema and it validates every call. ``run(request,
    params)`` returns the structured result, a JSON object."""

    name: str
    title: str
    description: str
    params: type[BaseModel]
    run: Callable[[HttpRequest, Any], dict[str, Any]]
    output: type[BaseModel] | None = None
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
