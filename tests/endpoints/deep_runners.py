"""Runners for tests/endpoints/test_bounds.py: what a python runner may
hand back that the ledger cannot store, or cannot even write."""

from __future__ import annotations

import inspect
import json
from typing import Any

from runtime.runners import TurnContext


def nest(depth: int, leaf: Any = 1) -> Any:
    """``depth`` objects, one inside the other: ``{"a": {"a": ... leaf}}``."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def nest_text(depth: int, leaf: str) -> str:
    """``nest(depth, leaf)`` as JSON text, at any depth (json.dumps has a limit)."""
    return '{"a": ' * depth + json.dumps(leaf) + "}" * depth


def same(ctx: TurnContext) -> dict[str, Any]:
    """The input as the result: as deep as what was admitted."""
    return ctx.input


def frames(ctx: TurnContext) -> dict[str, Any]:
    """How deep the stack is where a runner runs (the margin's measure)."""
    return {"frames": len(inspect.stack(0))}


def unstorable(ctx: TurnContext) -> Any:
    """A result the ledger cannot store, as ``input.kind`` says."""
    kind = ctx.input["kind"]
    if kind == "nul":
        return {"a": "x\x00y"}
    if kind == "surrogate":
        return {"a": "\udc00"}
    if kind == "deep":
        return nest(800)
    if kind == "set":
        return {"a": {1, 2}}
    if kind == "mixed_keys":
        # json.dumps writes either kind of key, but cannot sort the two
        # together: the finish's own canonical JSON fails (a crash in the
        # worker's code, not a value check).
        return {"a": {1: "x", "b": "y"}}
    return {"ok": True}
