"""The OpenAI Agents SDK adapter (``framework: "openai_agents"``; needs the
optional dependency group ``openai-agents``).

- Memory: the conversation is given through the SDK's ``Session`` protocol
  (a session over the endpoint's history); the items the run adds to it are
  the turn's messages.
- Delegation: the adapter adds a ``delegate(endpoint, input)`` function tool
  that needs approval, so a call to it interrupts the run (several calls in
  one response, several interruptions). The run's ``RunState`` is saved with
  the turn's messages; the resumed turn restores it, approves the delegate
  calls, and the tool returns the child's result (or an error text for a
  child that failed) from the run context.
- Approvals: any other tool with ``needs_approval`` interrupts the same way
  and waits for an owner; the decision is ``RunState.approve`` or
  ``RunState.reject`` with the owner's reason.
- Receipts: ``RunHooks.on_tool_start`` / ``on_tool_end``. A tool named in
  the runner's ``side_effect_tools`` gets an idempotency key in its receipt;
  the tool reads it with ``runtime.agents.idempotency_key(ctx.tool_call_id)``.
- Tracing to OpenAI's servers is off (``RunConfig(tracing_disabled=True)``):
  the ledger is the trace, and a turn sends nothing its runner did not ask for.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import Any

from agents import Agent, RunConfig, RunHooks, Runner, RunState, function_tool
from agents.memory.session import SessionABC
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from .protocol import (
    DELEGATE_TOOL,
    AgentStep,
    AgentTurn,
    ApprovalRequest,
    Delegation,
    ToolHooks,
    notes_instructions,
)

# The run context's key under which the resumed run finds its answers.
ANSWERS = "claimcheck_answers"


@function_tool(name_override=DELEGATE_TOOL, needs_approval=True, strict_mode=False)
def delegate(ctx: ToolContext[dict], endpoint: str, input: dict) -> str:  # noqa: A002
    """Ask another Claimcheck endpoint to do part of the work. `endpoint` is its
    address, `input` the JSON object it takes. The answer arrives later as
    this call's result (or an error if that work failed)."""
    answer = ((ctx.context or {}).get(ANSWERS) or {}).get(ctx.tool_call_id)
    if answer is None:
        return "error: no answer was recorded for this delegation"
    if answer["kind"] == "result":
        return json.dumps(answer["value"], default=str)
    return "error: the delegated work did not succeed: " + json.dumps(answer["value"], default=str)


class _History(SessionABC):
    """The endpoint's history as a Session: reads what Claimcheck loaded,
    keeps what the run adds (the turn's messages) for the finish to store."""

    def __init__(self, items: list[Any]) -> None:
        self.session_id = "claimcheck"
        self.items = list(items)
        self.added: list[Any] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return list(self.items[-limit:] if limit else self.items)

    async def add_items(self, items: list[Any]) -> None:
        self.items.extend(items)
        self.added.extend(items)

    async def pop_item(self) -> Any:
        if not self.items:
            return None
        item = self.items.pop()
        if self.added and self.added[-1] is item:
            self.added.pop()
        return item

    async def clear_session(self) -> None:
        self.items.clear()
        self.added.clear()


class _Receipts(RunHooks):
    def __init__(self, hooks: ToolHooks, side_effect_tools: set[str]) -> None:
        self.hooks = hooks
        self.side_effect_tools = side_effect_tools
        self.open: dict[str, tuple[str, float]] = {}

    async def on_tool_start(self, context, agent, tool) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id is None:
            return
        try:
            args = json.loads(getattr(context, "tool_arguments", "") or "{}")
        except ValueError:
            args = getattr(context, "tool_arguments", "")
        self.hooks.started(tool.name, call_id, args, tool.name in self.side_effect_tools)
        self.open[call_id] = (tool.name, time.monotonic())

    async def on_tool_end(self, context, agent, tool, result) -> None:
        call_id = getattr(context, "tool_call_id", None)
        opened = self.open.pop(call_id, None) if call_id else None
        if opened is not None:
            name, began = opened
            self.hooks.ended(
                name, call_id, "ok", time.monotonic() - began, to_jsonable_python(result)
            )

    def cancel_open(self) -> None:
        for call_id, (name, began) in list(self.open.items()):
            self.hooks.ended(name, call_id, "cancelled", time.monotonic() - began, None)
        self.open.clear()


def _with_delegate(agent: Agent) -> Agent:
    if any(getattr(t, "name", None) == DELEGATE_TOOL for t in agent.tools):
        return agent
    return agent.clone(tools=[*agent.tools, delegate])


def _with_notes(agent: Agent, notes: str) -> Agent:
    """The agent with the endpoint generation's notes after its own
    instructions (a callable instructions is left as it is: notes go first)."""
    extra = notes_instructions(notes)
    if not extra:
        return agent
    own = agent.instructions
    if callable(own):

        async def combined(ctx, agent_):
            base = own(ctx, agent_)
            if inspect.isawaitable(base):
                base = await base
            return f"{base}\n\n{extra}" if base else extra

        return agent.clone(instructions=combined)
    return agent.clone(instructions=f"{own}\n\n{extra}" if own else extra)


def _plain(items: list[Any]) -> list[Any]:
    return json.loads(json.dumps(to_jsonable_python(items), default=str))


class OpenAIAgentsAdapter:
    framework = "openai_agents"

    def __init__(self) -> None:
        self.side_effect_tools: set[str] = set()

    def check(self, agent: Any) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"an agents.Agent is needed, not {type(agent).__name__}")

    async def run(self, agent: Agent, turn: AgentTurn) -> AgentStep:
        agent = _with_notes(_with_delegate(agent), turn.notes)
        history = [m for exchange in turn.history for m in exchange] + (turn.resumed or [])
        session = _History(history)
        receipts = _Receipts(turn.hooks, set(turn.options.get("side_effect_tools") or ()))
        config = RunConfig(tracing_disabled=True)
        if turn.resumed is None:
            run_input: Any = turn.prompt
            context: dict[str, Any] = {ANSWERS: {}}
        else:
            answers = {k: {"kind": a.kind, "value": a.value} for k, a in turn.answers.items()}
            state = await RunState.from_json(agent, turn.state, context_override={ANSWERS: answers})
            for item in state.get_interruptions():
                call_id = item.raw_item.call_id
                answer = turn.answers.get(call_id)
                if item.raw_item.name == DELEGATE_TOOL or (answer and answer.kind == "approved"):
                    state.approve(item)
                else:
                    reason = answer.reason if answer else ""
                    state.reject(
                        item,
                        rejection_message=f"an owner denied this call: {reason}"
                        if reason
                        else "an owner denied this call",
                    )
            run_input, context = state, None
        try:
            result = await Runner.run(
                agent,
                run_input,
                context=context,
                session=session,
                hooks=receipts,
                run_config=config,
            )
        except asyncio.CancelledError:
            receipts.cancel_open()
            raise
        usage = result.context_wrapper.usage
        step = AgentStep(
            messages=_plain(session.added),
            usage={
                "requests": usage.requests,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
            },
        )
        if not result.interruptions:
            step.output = to_jsonable_python(result.final_output)
            return step
        step.done = False
        step.state = result.to_state().to_json()
        for item in result.interruptions:
            raw = item.raw_item
            try:
                args = json.loads(raw.arguments or "{}")
            except ValueError:
                args = raw.arguments
            if raw.name == DELEGATE_TOOL:
                args = args if isinstance(args, dict) else {}
                step.delegations.append(
                    Delegation(
                        call_id=raw.call_id, endpoint=args.get("endpoint"), input=args.get("input")
                    )
                )
            else:
                step.approvals.append(
                    ApprovalRequest(call_id=raw.call_id, tool=raw.name, args=args)
                )
        return step


ADAPTER = OpenAIAgentsAdapter()
