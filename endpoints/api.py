"""Endpoint and turn routes: parse, call one service, render."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from config.errors import Forbidden, NotFound
from tickets.selectors import iso

from . import runtime, services
from .models import Endpoint, EndpointLock, Turn
from .selectors import open_case_id, resolve_endpoint

router = Router(tags=["endpoints"])
turns_router = Router(tags=["turns"])


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class EndpointIn(Strict):
    address: str = Field(min_length=1, max_length=200)
    runner: dict[str, Any]
    owners: list[str] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    turn_budget_s: float | None = None
    interrupt_grace_s: float | None = None
    heartbeat_timeout_s: float | None = None
    requires_approval: bool | None = None
    busy_policy: Literal["enqueue", "reject"] | None = None


class EndpointPatch(Strict):
    runner: dict[str, Any] | None = None
    owners: list[str] | None = None
    aliases: list[str] | None = None
    turn_budget_s: float | None = None
    interrupt_grace_s: float | None = None
    heartbeat_timeout_s: float | None = None
    requires_approval: bool | None = None
    busy_policy: Literal["enqueue", "reject"] | None = None


def endpoint_payload(endpoint: Endpoint) -> dict[str, Any]:
    from tickets.models import Ticket, TicketState

    lock = EndpointLock.objects.filter(endpoint=endpoint).first()
    case = open_case_id(endpoint.id)
    return {
        "address": endpoint.address,
        "aliases": list(endpoint.aliases.values_list("alias", flat=True)),
        "runner": endpoint.runner,
        "owners": (
            sorted(endpoint.owners.user_set.values_list("username", flat=True))
            if endpoint.owners_id
            else []
        ),
        "state": endpoint.state,
        "lock": {
            "holder_turn": str(lock.holder_id) if lock and lock.holder_id else None,
            "token": lock.token if lock else None,
            "acquired_at": iso(lock.acquired_at) if lock else None,
        },
        "queued": Ticket.objects.filter(endpoint=endpoint, state=TicketState.QUEUED).count(),
        "turn_seq": endpoint.turn_seq,
        "turn_budget_s": endpoint.turn_budget_s,
        "interrupt_grace_s": endpoint.interrupt_grace_s,
        "heartbeat_timeout_s": endpoint.heartbeat_timeout_s,
        "requires_approval": endpoint.requires_approval,
        "busy_policy": endpoint.busy_policy,
        "open_case": str(case) if case else None,
    }


def require_staff(request: HttpRequest) -> None:
    if not request.user.is_staff:
        raise Forbidden("only staff may manage endpoints")


@router.post("", response={201: dict})
def create_endpoint(request: HttpRequest, payload: EndpointIn):
    require_staff(request)
    fields = payload.model_dump(exclude_none=True)
    endpoint = services.create_endpoint(**fields)
    return Status(201, endpoint_payload(endpoint))


@router.get("", response=list[dict])
def list_endpoints(request: HttpRequest):
    return [endpoint_payload(e) for e in Endpoint.objects.order_by("address")]


@router.get("/{address}", response=dict)
def get_endpoint(request: HttpRequest, address: str):
    return endpoint_payload(resolve_endpoint(address))


@router.patch("/{address}", response=dict)
def patch_endpoint(request: HttpRequest, address: str, payload: EndpointPatch):
    require_staff(request)
    changes = payload.model_dump(exclude_unset=True)
    endpoint = services.update_endpoint(address=address, changes=changes)
    return endpoint_payload(endpoint)


# --- Turns ----------------------------------------------------------------------


def get_turn(turn_id: str) -> Turn:
    try:
        turn = Turn.objects.filter(id=uuid.UUID(turn_id)).first()
    except ValueError:
        turn = None
    if turn is None:
        raise NotFound(f"turn {turn_id} not found")
    return turn


def turn_payload(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.id),
        "endpoint": turn.endpoint.address,
        "ticket": str(turn.ticket_id),
        "seq": turn.seq,
        "state": turn.state,
        "started_at": iso(turn.started_at),
        "heartbeat_at": iso(turn.heartbeat_at),
        "deadline_at": iso(turn.deadline_at),
        "interrupt_requested_at": iso(turn.interrupt_requested_at),
        "ended_at": iso(turn.ended_at),
        "stop_evidence": turn.stop_evidence,
    }


class SeqIn(Strict):
    seq: int


class ResultIn(Strict):
    seq: int
    result: Any = None
    error: Any = None
    artifacts: list[dict[str, Any]] | None = None


class StoppedIn(Strict):
    seq: int
    detail: Any = None


@turns_router.get("/{turn_id}", response=dict)
def read_turn(request: HttpRequest, turn_id: str):
    return turn_payload(get_turn(turn_id))


@turns_router.post("/{turn_id}/heartbeat", response=dict)
def heartbeat(request: HttpRequest, turn_id: str, payload: SeqIn):
    turn = get_turn(turn_id)
    state = runtime.heartbeat(turn_id=turn.id, seq=payload.seq, source="api", strict=True)
    return {**turn_payload(Turn.objects.get(id=turn.id)), "interrupt_requested": state.interrupted}


@turns_router.post("/{turn_id}/result", response=dict)
def post_result(request: HttpRequest, turn_id: str, payload: ResultIn):
    turn = get_turn(turn_id)
    if payload.error is not None:
        outcome = runtime.Outcome.failure(payload.error)
    else:
        outcome = runtime.Outcome.success(payload.result, artifacts=payload.artifacts or [])
    runtime.finish_turn(
        turn_id=turn.id, seq=payload.seq, outcome=outcome, source="api", strict=True
    )
    return turn_payload(Turn.objects.get(id=turn.id))


@turns_router.post("/{turn_id}/stopped", response=dict)
def post_stopped(request: HttpRequest, turn_id: str, payload: StoppedIn):
    turn = get_turn(turn_id)
    runtime.finish_turn(
        turn_id=turn.id,
        seq=payload.seq,
        outcome=runtime.Outcome.stopped("agent_stop_receipt", {"detail": payload.detail}),
        source="api",
        strict=True,
    )
    return turn_payload(Turn.objects.get(id=turn.id))
