"""The LangGraph adapter (``framework: "langgraph"``; needs the optional
dependency group ``langgraph``).

The runner's ``path`` names a compiled graph (``StateGraph(...).compile()``,
without a checkpointer of its own) or a factory returning one. Its state has
a ``messages`` channel of LangChain messages (``MessagesState``).

- Memory: the endpoint's history is the ``messages`` the graph starts from
  (each message as LangChain's own dict, ``messages_to_dict``), followed by
  the prompt as a ``HumanMessage``; the messages the run appends to the
  state are the turn's messages. The final output is the last message's
  text.
- Delegation: a node calls :func:`delegate` (an ``interrupt()`` marked as
  a delegation). The run stops there; every node that delegated in the same
  step is one child (fan out with ``Send`` for several children in one
  round). The graph's checkpoint is saved with the turn's messages; the
  resumed turn restores it and resumes each interrupt with its child's
  answer: :func:`delegate` returns the child's result, or raises
  :class:`DelegationFailed` when the child failed, was cancelled or
  orphaned.
- Approvals: any other ``interrupt(value)`` waits for an owner. ``value``
  ``{"tool": name, "args": {...}}`` names the call for the owner (any other
  value is shown as the args of ``interrupt``); ``interrupt`` returns
  ``{"approved": bool, "reason": str}``.
- Receipts: a LangChain callback reports every tool's start and end (tools
  a ``ToolNode`` runs); a tool named in the runner's ``side_effect_tools``
  gets an idempotency key (``runtime.agents.idempotency_key(call_id)``).
- The node's config carries ``configurable["claimcheck_notes"]`` (the
  generation's notes for this run, as instructions to add to the model's;
  empty when none) and ``configurable["claimcheck_input"]``
  (the ticket's input).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt
from langgraph.pregel import Pregel
from langgraph.types import Command, interrupt
from pydantic_core import to_jsonable_python

from .protocol import (
    DELEGATE_TOOL,
    AgentStep,
    AgentTurn,
    Answer,
    ApprovalRequest,
    Delegation,
    ToolHooks,
    notes_instructions,
)

# The marker of a delegation among a run's interrupts.
MARKER = "claimcheck"
THREAD = "claimcheck"
# Checkpoint format of the saved state (a change makes old waits unreadable,
# and says so, rather than resuming them wrongly).
STATE_VERSION = 1


class DelegationFailed(Exception):  # noqa: N818 - the node's view: the delegation failed
    """The delegated work did not succeed: ``error`` says how (the child's
    id, state and error)."""

    def __init__(self, error: Any) -> None:
        super().__init__(f"the delegated work did not succeed: {error}")
        self.error = error


def delegate(endpoint: str, input: dict[str, Any]) -> Any:  # noqa: A002 - the tool's API
    """Ask another Claimcheck endpoint to do part of the work, from inside a
    graph node. The turn ends waiting; when the child is done the node runs
    again from its start and this call returns the child's result (or
    raises :class:`DelegationFailed`). Work before it in the node runs again
    on the resume: keep a node that delegates free of side effects before
    the call."""
    answer = interrupt({MARKER: DELEGATE_TOOL, "endpoint": endpoint, "input": input})
    if not isinstance(answer, dict) or answer.get("kind") not in ("result", "error"):
        raise DelegationFailed({"detail": "no answer was recorded for this delegation"})
    if answer["kind"] == "error":
        raise DelegationFailed(answer.get("value"))
    return answer.get("value")


class _Receipts(AsyncCallbackHandler):
    """A receipt when each tool call starts and when it ends."""

    def __init__(self, hooks: ToolHooks, side_effect_tools: set[str]) -> None:
        self.hooks = hooks
        self.side_effect_tools = side_effect_tools
        self.open: dict[Any, tuple[str, str, float]] = {}

    async def on_tool_start(self, serialized, input_str, *, run_id, inputs=None, **kwargs):
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        call_id = kwargs.get("tool_call_id") or str(run_id)
        args = inputs if inputs is not None else input_str
        self.hooks.started(
            name, call_id, to_jsonable_python(args, fallback=str), name in self.side_effect_tools
        )
        self.open[run_id] = (name, call_id, time.monotonic())

    async def on_tool_end(self, output, *, run_id, **kwargs):
        self._end(
            run_id, "ok", to_jsonable_python(getattr(output, "content", output), fallback=str)
        )

    async def on_tool_error(self, error, *, run_id, **kwargs):
        if isinstance(error, asyncio.CancelledError):
            # The runtime's interrupt cancelled the run at the tool's await.
            self._end(run_id, "cancelled", None)
            return
        status = "deferred" if isinstance(error, GraphInterrupt) else "error"
        self._end(run_id, status, {"error": f"{type(error).__name__}: {error}"})

    def _end(self, run_id, status: str, result: Any) -> None:
        opened = self.open.pop(run_id, None)
        if opened is not None:
            name, call_id, began = opened
            self.hooks.ended(name, call_id, status, time.monotonic() - began, result)

    def cancel_open(self) -> None:
        for name, call_id, began in self.open.values():
            self.hooks.ended(name, call_id, "cancelled", time.monotonic() - began, None)
        self.open.clear()


def _b64(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode()]


def _unb64(value: list[str]) -> tuple[str, bytes]:
    return value[0], base64.b64decode(value[1])


def _save(saver: InMemorySaver, config: dict[str, Any]) -> dict[str, Any]:
    """The thread's last checkpoint and its pending writes (the interrupts,
    the writes of nodes that finished in the interrupted step), JSON-able:
    the graph's own serialiser, base64."""
    saved = saver.get_tuple(config)
    serde = saver.serde
    return {
        "v": STATE_VERSION,
        "checkpoint": _b64(serde.dumps_typed(saved.checkpoint)),
        "metadata": _b64(serde.dumps_typed(saved.metadata)),
        "writes": [
            [task_id, channel, _b64(serde.dumps_typed(value))]
            for task_id, channel, value in saved.pending_writes or []
        ],
    }


def _restore(saver: InMemorySaver, config: dict[str, Any], state: Any) -> None:
    if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
        raise RuntimeError("the saved LangGraph checkpoint is missing or of another version")
    serde = saver.serde
    checkpoint = serde.loads_typed(_unb64(state["checkpoint"]))
    metadata = serde.loads_typed(_unb64(state["metadata"]))
    stored = saver.put(
        {"configurable": {**config["configurable"], "checkpoint_ns": ""}},
        checkpoint,
        metadata,
        checkpoint.get("channel_versions", {}),
    )
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in state["writes"]:
        by_task.setdefault(task_id, []).append((channel, serde.loads_typed(_unb64(value))))
    for task_id, writes in by_task.items():
        saver.put_writes(stored, writes, task_id)


def _answer(kind: str, value: Any, reason: str) -> Any:
    if kind in ("result", "error"):
        return {"kind": kind, "value": value}
    return {"approved": kind == "approved", "reason": reason}


def _text(message: BaseMessage) -> Any:
    content = message.content
    if isinstance(content, str):
        return content
    return to_jsonable_python(content, fallback=str)


class LangGraphAdapter:
    framework = "langgraph"
    _warm = False

    def warm(self) -> None:
        """One throwaway run of a small graph in the supervising worker
        (a delegation, its checkpoint saved and restored, a tool call, the
        resume): each turn's forked process inherits the imports and the
        schemas LangChain builds on first use instead of paying for them
        inside its budget."""
        if self._warm:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            # An event loop runs in this thread: the turn's process warms.
            return
        from langchain_core.tools import tool
        from langgraph.graph import END, START, MessagesState, StateGraph

        @tool
        def noop(x: int) -> int:
            """Return x."""
            return x

        async def node(state: MessagesState, config) -> dict[str, Any]:
            delegate("warm", {})
            call = {"name": "noop", "args": {"x": 1}, "id": "warm", "type": "tool_call"}
            return {"messages": [await noop.ainvoke(call, config)]}

        builder = StateGraph(MessagesState)
        builder.add_node("node", node)
        builder.add_edge(START, "node")
        builder.add_edge("node", END)
        graph = builder.compile()
        hooks = ToolHooks(
            started=lambda *a: None, ended=lambda *a: None, idempotency_key=lambda c: ""
        )
        turn = AgentTurn(
            prompt="warm", history=[], resumed=None, state=None, answers={}, hooks=hooks
        )
        step = asyncio.run(self.run(graph, turn))
        resume = AgentTurn(
            prompt=None,
            history=[],
            resumed=step.messages,
            state=step.state,
            answers={d.call_id: Answer("result", 1) for d in step.delegations},
            hooks=hooks,
        )
        asyncio.run(self.run(graph, resume))
        self._warm = True

    def check(self, agent: Any) -> None:
        if not isinstance(agent, Pregel):
            raise TypeError(f"a compiled LangGraph graph is needed, not {type(agent).__name__}")

    async def run(self, agent: Pregel, turn: AgentTurn) -> AgentStep:
        saver = InMemorySaver()
        graph = agent.copy(update={"checkpointer": saver})
        receipts = _Receipts(turn.hooks, set(turn.options.get("side_effect_tools") or ()))
        config: dict[str, Any] = {
            "configurable": {
                "thread_id": THREAD,
                "claimcheck_notes": notes_instructions(turn.notes) or "",
                "claimcheck_input": turn.input,
            },
            "callbacks": [receipts],
        }
        history = [m for exchange in turn.history for m in exchange] + (turn.resumed or [])
        known = len(history)
        if turn.resumed is None:
            start = [*messages_from_dict(history), HumanMessage(turn.prompt or "")]
            run_input: Any = {"messages": start}
        else:
            _restore(saver, config, turn.state)
            # The checkpoint's own messages (the conversation as it was when
            # the exchange began waiting): the run appends after them.
            known = len((await graph.aget_state(config)).values.get("messages") or [])
            run_input = Command(
                resume={k: _answer(a.kind, a.value, a.reason) for k, a in turn.answers.items()}
            )
        try:
            result = await graph.ainvoke(run_input, config)
        except asyncio.CancelledError:
            receipts.cancel_open()
            raise
        messages = list(result.get("messages") or [])
        new = messages[known:]
        step = AgentStep(messages=messages_to_dict(new), usage=_usage(new))
        interrupts = result.get("__interrupt__") or []
        if not interrupts:
            last = messages[-1] if messages else None
            step.output = _text(last) if last is not None else None
            return step
        step.done = False
        step.state = _save(saver, {"configurable": {"thread_id": THREAD}})
        for item in interrupts:
            call_id = item.id or uuid.uuid4().hex
            value = item.value
            if isinstance(value, dict) and value.get(MARKER) == DELEGATE_TOOL:
                step.delegations.append(
                    Delegation(
                        call_id=call_id, endpoint=value.get("endpoint"), input=value.get("input")
                    )
                )
            elif isinstance(value, dict) and isinstance(value.get("tool"), str):
                step.approvals.append(
                    ApprovalRequest(
                        call_id=call_id,
                        tool=value["tool"],
                        args=to_jsonable_python(value.get("args"), fallback=str),
                    )
                )
            else:
                step.approvals.append(
                    ApprovalRequest(
                        call_id=call_id,
                        tool="interrupt",
                        args=to_jsonable_python(value, fallback=str),
                    )
                )
        return step


def _usage(messages: list[BaseMessage]) -> dict[str, int]:
    requests = input_tokens = output_tokens = 0
    for m in messages:
        if isinstance(m, AIMessage):
            requests += 1
            meta = m.usage_metadata or {}
            input_tokens += int(meta.get("input_tokens") or 0)
            output_tokens += int(meta.get("output_tokens") or 0)
    if not requests:
        return {}
    return {"requests": requests, "input_tokens": input_tokens, "output_tokens": output_tokens}


ADAPTER = LangGraphAdapter()
