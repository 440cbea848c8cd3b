"""A small research agent with two sub-agents, as LangGraph graphs.

The same shape as ``research_pydantic_ai.py``: ``researcher`` fans out
(``Send``) to one ``ask`` node per sub-agent, each calling the adapter's
``delegate`` for ``examples.lg-search`` and ``examples.lg-summarize`` in
the same step: the turn ends waiting on both children, and their callbacks
resume the graph from its checkpoint, where ``delegate`` returns each
child's answer and ``brief`` writes the brief.

Offline: each graph's chat model is a scripted LangChain chat model (no
network, no key). Any LangChain chat model takes its place (e.g.
``langchain_openai.ChatOpenAI``, with the key as a named secret in the
runner's ``secrets``). ``examples/run_research.py langgraph`` runs it end to
end.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send

from runtime.agents.langgraphs import DelegationFailed, delegate

SEARCH, SUMMARIZE = "examples.lg-search", "examples.lg-summarize"


class Offline(BaseChatModel):
    """A chat model that answers the last user message with ``answer``."""

    answer: Callable[[str], str]

    @property
    def _llm_type(self) -> str:
        return "offline"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        message = AIMessage(self.answer(_prompt(messages)))
        return ChatResult(generations=[ChatGeneration(message=message)])


def _prompt(messages: list[BaseMessage]) -> str:
    asked = [m for m in messages if isinstance(m, HumanMessage)]
    return str(asked[-1].content) if asked else ""


class Research(MessagesState):
    # Each sub-agent's answer, in the order the researcher asked.
    answers: Annotated[list[str], operator.add]


def _fan_out(state: Research) -> list[Send]:
    topic = _prompt(state["messages"])
    return [Send("ask", {"endpoint": e, "topic": topic}) for e in (SEARCH, SUMMARIZE)]


def _ask(task: dict[str, Any]) -> dict[str, Any]:
    # Nothing before delegate: the node runs again from its start on resume.
    try:
        answer = delegate(task["endpoint"], {"prompt": task["topic"]})
    except DelegationFailed as exc:
        answer = f"({task['endpoint']} failed: {exc.error})"
    return {"answers": [str(answer)]}


def _brief(state: Research) -> dict[str, Any]:
    return {"messages": [AIMessage("Brief: " + "; ".join(state["answers"]))]}


def researcher():
    graph = StateGraph(Research)
    graph.add_node("ask", _ask)
    graph.add_node("brief", _brief)
    graph.add_conditional_edges(START, _fan_out, ["ask"])
    graph.add_edge("ask", "brief")
    graph.add_edge("brief", END)
    return graph.compile()


def _answering(model: BaseChatModel):
    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


def searcher():
    return _answering(Offline(answer=lambda topic: f"3 sources on {topic!r}"))


def summarizer():
    return _answering(Offline(answer=lambda topic: f"{topic} in one line"))
