"""The python callable bench/agents.py measures the agent runner against:
the same answer as demo.agent's ``remember`` (it reads the endpoint's
history, as the agent does), without a framework."""

from __future__ import annotations


def remember(ctx) -> str:
    prompt = str(ctx.input.get("prompt", ""))
    earlier = [e for e in ctx.history if isinstance(e.get("input"), dict)]
    return f"noted: {prompt.partition(' ')[2]} ({len(earlier)} earlier prompts)"
