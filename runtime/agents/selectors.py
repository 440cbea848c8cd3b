"""Reads of an agent endpoint for its owners: the conversation (its memory)
and the tool calls waiting for an owner's approval."""

from __future__ import annotations

import logging
from typing import Any

from endpoints.models import Endpoint
from tickets.models import WAIT_EVENT_KINDS, ContextEntry, Ticket, TicketEvent, TicketState

from . import memory
from .limits import CONVERSATION_MAX_TURNS

log = logging.getLogger(__name__)


def conversation(endpoint: Endpoint, *, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` agent turns of the endpoint, oldest first: each
    with its ticket, exchange, status and messages (the framework's JSON),
    read from the artifacts. A missing or altered artifact shows as an
    ``error`` on that turn instead of failing the page."""
    limit = max(1, min(limit, CONVERSATION_MAX_TURNS))
    rows = list(
        ContextEntry.objects.filter(endpoint=endpoint)
        .order_by("-seq")
        .values("seq", "ticket_id", "artifacts", "created_at")[: limit * 2]
    )
    turns: list[dict[str, Any]] = []
    for row in rows:
        pointer = memory.pointer_of(row)
        if pointer is None:
            continue
        item: dict[str, Any] = {
            "seq": row["seq"],
            "ticket": str(row["ticket_id"]),
            "exchange": pointer.get("exchange"),
            "status": pointer.get("status"),
            "framework": pointer.get("framework"),
            "sha256": pointer.get("sha256"),
            "bytes": pointer.get("bytes"),
            "at": row["created_at"].isoformat(),
            "messages": [],
        }
        try:
            item["messages"] = memory.read(pointer).get("messages") or []
        except memory.MemoryError_ as exc:
            log.warning("conversation of %s: %s", endpoint.address, exc)
            item["error"] = str(exc)
        turns.append(item)
        if len(turns) >= limit:
            break
    return list(reversed(turns))


def waiting_continuation(ticket: Ticket) -> dict[str, Any] | None:
    """The agent continuation a waiting ticket's last wait (or round) recorded."""
    detail = (
        TicketEvent.objects.filter(ticket_id=ticket.id, kind__in=WAIT_EVENT_KINDS)
        .order_by("-id")
        .values_list("detail", flat=True)
        .first()
    )
    cont = (detail or {}).get("continuation") or {}
    return cont if isinstance(cont.get("agent"), dict) else None


def pending_approvals(endpoint: Endpoint, *, ticket: Ticket | None = None) -> list[dict[str, Any]]:
    """Every call waiting for an owner's approval on the endpoint's waiting
    tickets (or on one ticket): ticket, call id, tool, arguments (or their
    digest when large), the turn that asked, and the decision once made."""
    tickets = Ticket.objects.filter(endpoint=endpoint, state=TicketState.WAITING)
    if ticket is not None:
        tickets = tickets.filter(id=ticket.id)
    out = []
    for waiting in tickets.order_by("id")[:200]:
        cont = waiting_continuation(waiting)
        if cont is None:
            continue
        round_ = cont["agent"].get("round") or 1
        decided = {
            e["detail"].get("call_id"): e
            for e in TicketEvent.objects.filter(
                ticket_id=waiting.id, kind="tool_call_decided"
            ).values("detail", "actor", "at")
            if (e["detail"].get("round") or 1) == round_
        }
        for call_id, call in cont["agent"].get("pending", {}).items():
            if call.get("kind") != "approval":
                continue
            decision = decided.get(call_id)
            out.append(
                {
                    "ticket": str(waiting.id),
                    "call_id": call_id,
                    "tool": call.get("tool"),
                    "args": call.get("args"),
                    "args_sha256": call.get("args_sha256"),
                    "turn": call.get("turn"),
                    "decision": None
                    if decision is None
                    else {
                        "approved": decision["detail"].get("approved"),
                        "reason": decision["detail"].get("reason"),
                        "actor": decision["actor"],
                        "at": decision["at"].isoformat(),
                    },
                }
            )
    return out


def _text(value: Any, limit: int = 2000) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def message_lines(messages: list[Any]) -> list[dict[str, str]]:
    """A framework's messages as ``{role, text}`` lines for a reader: Pydantic
    AI's parts and the Agents SDK's items alike; anything else as JSON."""
    lines: list[dict[str, str]] = []
    for message in messages:
        if not isinstance(message, dict):
            lines.append({"role": "item", "text": _text(message)})
            continue
        if "parts" in message:  # Pydantic AI
            for part in message.get("parts") or []:
                kind = part.get("part_kind", "")
                if kind == "user-prompt":
                    lines.append({"role": "user", "text": _text(part.get("content"))})
                elif kind == "text":
                    lines.append({"role": "assistant", "text": _text(part.get("content"))})
                elif kind == "tool-call":
                    lines.append(
                        {
                            "role": "tool call",
                            "text": f"{part.get('tool_name')}({_text(part.get('args'))}) "
                            f"[{part.get('tool_call_id')}]",
                        }
                    )
                elif kind == "tool-return":
                    outcome = part.get("outcome") or "success"
                    lines.append(
                        {
                            "role": f"tool result ({outcome})",
                            "text": f"{part.get('tool_name')}: {_text(part.get('content'))}",
                        }
                    )
                elif kind in ("system-prompt", "instructions"):
                    continue
                else:
                    lines.append({"role": kind or "part", "text": _text(part)})
            continue
        item_type = message.get("type")  # the Agents SDK's input items
        if item_type == "function_call":
            lines.append(
                {
                    "role": "tool call",
                    "text": f"{message.get('name')}({message.get('arguments')}) "
                    f"[{message.get('call_id')}]",
                }
            )
        elif item_type == "function_call_output":
            lines.append({"role": "tool result", "text": _text(message.get("output"))})
        elif "role" in message:
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(
                    str(c.get("text", "")) for c in content if isinstance(c, dict)
                ) or _text(content)
            lines.append({"role": str(message["role"]), "text": _text(content)})
        else:
            lines.append({"role": item_type or "item", "text": _text(message)})
    return lines
