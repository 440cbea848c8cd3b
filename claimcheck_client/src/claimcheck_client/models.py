"""Typed bodies of the Claimcheck API (shared/API.md).

Each dataclass is built from the JSON the server sent with ``from_json``;
fields the server adds later are kept in ``raw``, so a newer server never
breaks an older client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired, TypedDict

TicketState = Literal[
    "queued", "running", "waiting", "succeeded", "failed", "cancelled", "recovering", "orphaned"
]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "orphaned"})


class ErrorBody(TypedDict):
    """Every error: ``{"error": code, "detail": sentence, ...}``."""

    error: str
    detail: str
    ticket: NotRequired[str]  # dedupe_conflict: the ticket that holds the key
    state: NotRequired[str]  # invalid_transition: the ticket's state
    case: NotRequired[str | None]  # endpoint_quarantined: the open recovery case
    trace_id: NotRequired[str]  # circuit_open
    limit: NotRequired[int]  # circuit_open, too_large


def parse_time(value: str | None) -> datetime | None:
    """ISO 8601 UTC (``...Z``) to an aware datetime."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Artifact:
    uri: str
    sha256: str
    bytes: int
    media_type: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Artifact:
        return cls(
            uri=data.get("uri", ""),
            sha256=data.get("sha256", ""),
            bytes=int(data.get("bytes") or 0),
            media_type=data.get("media_type", ""),
        )


@dataclass(frozen=True)
class TurnRef:
    """The exact turn registered for a ticket."""

    id: str
    seq: int
    state: str


@dataclass(frozen=True)
class ReturnTo:
    endpoint: str
    continuation: dict[str, Any] | None = None


@dataclass(frozen=True)
class CallbackInfo:
    state: str  # none | pending | accepted | recorded
    ticket: str | None = None


@dataclass(frozen=True)
class DeliveryInfo:
    state: str  # none | awaiting_approval | pending | attempted | delivered | failed
    attempts: int = 0


@dataclass(frozen=True)
class Ticket:
    id: str
    endpoint: str
    dedupe_key: str | None
    state: str
    parent: str | None
    trace_id: str
    depth: int
    input: dict[str, Any]
    result: Any
    error: Any
    artifacts: list[Artifact]
    turn: TurnRef | None
    return_to: ReturnTo | None
    requester: dict[str, Any]
    callback: CallbackInfo
    delivery: DeliveryInfo
    created_at: datetime | None
    updated_at: datetime | None
    duplicate: bool = False
    # A retry names the ticket it retries; a retried ticket names its retry.
    retry_of: str | None = None
    retry: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ticket:
        turn = data.get("turn")
        return_to = data.get("return_to")
        callback = data.get("callback") or {}
        delivery = data.get("delivery") or {}
        return cls(
            id=str(data["id"]),
            endpoint=data.get("endpoint", ""),
            dedupe_key=data.get("dedupe_key"),
            state=data["state"],
            parent=_opt_str(data.get("parent")),
            trace_id=data.get("trace_id", ""),
            depth=int(data.get("depth") or 0),
            input=data.get("input") or {},
            result=data.get("result"),
            error=data.get("error"),
            artifacts=[Artifact.from_json(a) for a in data.get("artifacts") or []],
            turn=TurnRef(id=str(turn["id"]), seq=int(turn["seq"]), state=turn["state"])
            if turn
            else None,
            return_to=ReturnTo(return_to["endpoint"], return_to.get("continuation"))
            if return_to
            else None,
            requester=data.get("requester") or {},
            callback=CallbackInfo(
                state=callback.get("state", "none"), ticket=_opt_str(callback.get("ticket"))
            ),
            delivery=DeliveryInfo(
                state=delivery.get("state", "none"), attempts=int(delivery.get("attempts") or 0)
            ),
            created_at=parse_time(data.get("created_at")),
            updated_at=parse_time(data.get("updated_at")),
            duplicate=bool(data.get("duplicate", False)),
            retry_of=_opt_str(data.get("retry_of")),
            retry=_opt_str(data.get("retry")),
            raw=data,
        )


@dataclass(frozen=True)
class Event:
    """One row of a ticket's append-only timeline."""

    kind: str
    from_state: str
    to_state: str
    actor: str
    turn: str | None
    detail: dict[str, Any]
    at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        return cls(
            kind=data["kind"],
            from_state=data.get("from_state") or "",
            to_state=data.get("to_state") or "",
            actor=data.get("actor") or "",
            turn=_opt_str(data.get("turn")),
            detail=data.get("detail") or {},
            at=parse_time(data.get("at")),
        )


@dataclass(frozen=True)
class LineageNode:
    id: str
    parent: str | None
    endpoint: str
    state: str
    depth: int


@dataclass(frozen=True)
class Lineage:
    """Every ticket of a trace."""

    trace_id: str
    root: str
    nodes: list[LineageNode]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lineage:
        return cls(
            trace_id=data["trace_id"],
            root=str(data["root"]),
            nodes=[
                LineageNode(
                    id=str(n["id"]),
                    parent=_opt_str(n.get("parent")),
                    endpoint=n.get("endpoint", ""),
                    state=n["state"],
                    depth=int(n.get("depth") or 0),
                )
                for n in data.get("nodes") or []
            ],
        )


@dataclass(frozen=True)
class Turn:
    """``GET /turns/{id}`` and the answers of the turn API."""

    id: str
    endpoint: str
    ticket: str
    seq: int
    state: str
    started_at: datetime | None
    heartbeat_at: datetime | None
    deadline_at: datetime | None
    ended_at: datetime | None
    stop_evidence: dict[str, Any] | None
    # Set on a heartbeat's answer: the runtime asks the agent to stop.
    interrupt_requested: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Turn:
        return cls(
            id=str(data["id"]),
            endpoint=data.get("endpoint", ""),
            ticket=str(data.get("ticket", "")),
            seq=int(data["seq"]),
            state=data["state"],
            started_at=parse_time(data.get("started_at")),
            heartbeat_at=parse_time(data.get("heartbeat_at")),
            deadline_at=parse_time(data.get("deadline_at")),
            ended_at=parse_time(data.get("ended_at")),
            stop_evidence=data.get("stop_evidence"),
            interrupt_requested=bool(
                data.get("interrupt_requested") or data.get("interrupt_requested_at")
            ),
            raw=data,
        )
