"""A LangGraph agent on a scripted offline chat model (no network, no key)
for the adapter's tests: it answers like tests/agents/openai_agent.py
(remember, recall, delegate, send, instructions, steps).

The graph: ``agent`` asks the model; each tool call it makes goes to its own
node through ``Send`` (``delegate`` calls the adapter's ``delegate``, which
ends the turn waiting; ``send_report`` asks an owner with ``interrupt()``
and runs the tool when approved); the tool messages go back to ``agent``."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send, interrupt

from runtime.agents import idempotency_key
from runtime.agents.langgraphs import DelegationFailed, delegate


def _call(name: str, args: dict) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}


def _step_calls(step: str) -> list[dict[str, Any]]:
    verb, _, rest = step.strip().partition(" ")
    rest = rest.strip()
    if verb == "delegate-to":
        target, _, item = rest.partition(" ")
        return [_call("delegate", {"endpoint": target, "input": {"text": item}})]
    if verb == "delegate":
        return _delegations(rest)
    return [_call("send_report", {"to": rest or "owner"})]


def _delegations(rest: str) -> list[dict[str, Any]]:
    target = "demo.fail" if rest.startswith("fail") else "demo.echo"
    parts = [i.strip() for i in rest.split(",") if i.strip()] or ["hello"]
    return [_call("delegate", {"endpoint": target, "input": {"text": p}}) for p in parts]


def _said(mine: list[BaseMessage]) -> str:
    return "; ".join(f"{m.name}: {m.content}" for m in mine if isinstance(m, ToolMessage))


class ScriptedChatModel(BaseChatModel):
    """Answers from the conversation by rule, as a model would from its words."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

    def _answer(self, messages: list[BaseMessage]) -> AIMessage:
        usage = {
            "input_tokens": len(messages),
            "output_tokens": 1,
            "total_tokens": 1 + len(messages),
        }
        prompts = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        prompt = str(messages[prompts[-1]].content)
        mine = messages[prompts[-1] :]
        verb, _, rest = prompt.partition(" ")
        if verb == "steps":
            steps = [s for s in rest.split("|") if s.strip()]
            rounds = sum(1 for m in mine if isinstance(m, AIMessage) and m.tool_calls)
            if rounds < len(steps):
                return AIMessage("", tool_calls=_step_calls(steps[rounds]), usage_metadata=usage)
            return AIMessage("done: " + _said(mine), usage_metadata=usage)
        if isinstance(messages[-1], ToolMessage):
            return AIMessage("results: " + _said(mine), usage_metadata=usage)
        said = [str(messages[i].content) for i in prompts]
        if verb == "remember":
            text = f"noted: {rest}"
        elif verb == "recall":
            noted = [p.partition(" ")[2] for p in said[:-1] if p.startswith("remember ")]
            text = "I remember: " + "; ".join(noted)
        elif verb == "delegate":
            return AIMessage("", tool_calls=_delegations(rest), usage_metadata=usage)
        elif verb == "send":
            return AIMessage(
                "", tool_calls=[_call("send_report", {"to": rest})], usage_metadata=usage
            )
        elif verb == "slow":
            return AIMessage(
                "", tool_calls=[_call("slow", {"seconds": float(rest)})], usage_metadata=usage
            )
        elif verb == "instructions":
            system = [m.content for m in messages if isinstance(m, SystemMessage)]
            text = f"instructions: {system[0] if system else ''}"
        else:
            text = f"echo: {prompt}"
        return AIMessage(text, usage_metadata=usage)


MODEL = ScriptedChatModel()


@tool
def send_report(to: str, key: str) -> str:
    """Send the report (needs an owner's approval)."""
    return f"sent to {to} with key {key}"


@tool
async def slow(seconds: float) -> str:
    """Wait (a slow tool the runtime's interrupt cancels at its await)."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


async def slow_node(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
    return {"messages": [await slow.ainvoke(state["call"], config)]}


def agent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    instructions = "answer"
    notes = (config.get("configurable") or {}).get("claimcheck_notes")
    if notes:
        instructions += "\n\n" + notes
    reply = MODEL.invoke([SystemMessage(instructions), *state["messages"]], config)
    return {"messages": [reply]}


def route(state: MessagesState) -> Any:
    last = state["messages"][-1]
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return END
    return [Send(call["name"], {"call": call}) for call in last.tool_calls]


def delegate_node(state: dict[str, Any]) -> dict[str, Any]:
    call = state["call"]
    try:
        result = delegate(call["args"]["endpoint"], call["args"]["input"])
        text = json.dumps(result)
    except DelegationFailed as exc:
        text = f"error: {exc}"
    return {"messages": [ToolMessage(text, name="delegate", tool_call_id=call["id"])]}


async def send_node(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
    call = state["call"]
    decision = interrupt({"tool": "send_report", "args": call["args"]})
    if not decision.get("approved"):
        reason = decision.get("reason") or ""
        text = f"an owner denied this call: {reason}" if reason else "denied"
        return {"messages": [ToolMessage(text, name="send_report", tool_call_id=call["id"])]}
    args = {**call["args"], "key": idempotency_key(call["id"])}
    reply = await send_report.ainvoke({**call, "args": args}, config)
    return {"messages": [reply]}


def build():
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("delegate", delegate_node)
    graph.add_node("send_report", send_node)
    graph.add_node("slow", slow_node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["delegate", "send_report", "slow", END])
    graph.add_edge("delegate", "agent")
    graph.add_edge("send_report", "agent")
    graph.add_edge("slow", "agent")
    return graph.compile()
