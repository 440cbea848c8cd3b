"""The runtime's routes: the endpoint as it runs (its record with its lock,
queue and case; create, change, pause, resume), an agent's conversation and
approvals, turns and workers. Parse, call one service, render.

``endpoints_router`` is the one router of ``/api/v1/endpoints``: it serves
the runtime's routes and mounts the directory's (an endpoint's governed
changes, endpoints/api.py), which cannot mount the runtime's (it sits
below). The paths of the two are disjoint. A ticket's cancel is the
ledger's route (tickets/api.py), under its ``/tickets``."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Status
from ninja.security import HttpBearer

from accounts.auth import ApiKeyAuth
from core import limits
from core.errors import Forbidden, NotFound
from core.schemas import StrictTyped
from core.times import iso
from endpoints import services as endpoint_services
from endpoints.api import router as directory_router
from endpoints.models import Endpoint
from endpoints.schemas import EndpointOut, EndpointPauseOut
from endpoints.selectors import is_owner, resolve_endpoint
from tickets.models import Turn
from tickets.selectors import visible_tickets

from . import runners, services, turns
from .agents.limits import CONVERSATION_MAX_TURNS
from .agents.selectors import conversation, pending_approvals
from .agents.services import decide_tool_call
from .schemas import (
    ApprovalDecidedOut,
    ConversationOut,
    HeartbeatOut,
    PendingApprovalOut,
    TurnOut,
    WorkerConsumingOut,
    WorkersOut,
)
from .selectors import endpoint_payload, sees_workers, turn_for_token, workers_overview

endpoints_router = Router(tags=["endpoints"])
turns_router = Router(tags=["turns"])


# Strict types: a number or flag sent as a string ("5", "true") is 422, not coerced.
Strict = StrictTyped


class SubmittersIn(Strict):
    """Who may submit tickets besides the owners and staff; null: anyone."""

    users: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)


class EndpointIn(Strict):
    address: str = Field(min_length=1, max_length=limits.ADDRESS_CHARS)
    runner: dict[str, Any]
    owners: list[str] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    submitters: SubmittersIn | None = None
    turn_budget_s: float | None = None
    interrupt_grace_s: float | None = None
    heartbeat_timeout_s: float | None = None
    requires_approval: bool | None = None
    busy_policy: Literal["enqueue", "reject", "interrupt"] | None = None
    notes: str | None = Field(default=None, max_length=limits.NOTE_CHARS)
    change_requires_second_person: bool | None = None


class EndpointPatch(Strict):
    runner: dict[str, Any] | None = None
    owners: list[str] | None = None
    aliases: list[str] | None = None
    # Explicit null: anyone may submit again.
    submitters: SubmittersIn | None = None
    turn_budget_s: float | None = None
    interrupt_grace_s: float | None = None
    heartbeat_timeout_s: float | None = None
    requires_approval: bool | None = None
    busy_policy: Literal["enqueue", "reject", "interrupt"] | None = None
    notes: str | None = Field(default=None, max_length=limits.NOTE_CHARS)
    # Explicit null: the global CHANGE_REQUIRES_SECOND_PERSON decides.
    change_requires_second_person: bool | None = None
    # Why (recorded on the new generation) and, optionally, the generation
    # the change was made against (409 stale_generation when it moved on).
    reason: str | None = Field(default=None, max_length=limits.NOTE_CHARS)
    generation: int | None = Field(default=None, ge=1)


def require_staff(request: HttpRequest) -> None:
    if not request.user.is_staff:
        raise Forbidden("only staff may manage endpoints")


# exclude_unset: a caller who does not see the endpoint's configuration gets
# no ``submitters`` at all (null there would say "anyone may submit").
@endpoints_router.post("", response={201: EndpointOut}, exclude_unset=True)
def create_endpoint(request: HttpRequest, payload: EndpointIn):
    require_staff(request)
    fields = payload.model_dump(exclude_none=True)
    endpoint = endpoint_services.create_endpoint(**fields, actor=f"user:{request.user.username}")
    return Status(201, endpoint_payload(endpoint, user=request.user))


@endpoints_router.get("", response=list[EndpointOut], exclude_unset=True)
def list_endpoints(request: HttpRequest):
    return [endpoint_payload(e, user=request.user) for e in Endpoint.objects.order_by("address")]


@endpoints_router.get("/{address}", response=EndpointOut, exclude_unset=True)
def get_endpoint(request: HttpRequest, address: str):
    return endpoint_payload(resolve_endpoint(address), user=request.user)


@endpoints_router.patch("/{address}", response=EndpointOut, exclude_unset=True)
def patch_endpoint(request: HttpRequest, address: str, payload: EndpointPatch):
    require_staff(request)
    changes = payload.model_dump(exclude_unset=True)
    reason = changes.pop("reason", None) or ""
    expected = changes.pop("generation", None)
    endpoint = endpoint_services.update_endpoint(
        address=address,
        changes=changes,
        actor=f"user:{request.user.username}",
        reason=reason,
        expected_generation=expected,
    )
    return endpoint_payload(endpoint, user=request.user)


# --- Pause and resume (owners and staff) ----------------------------------------


class ReasonIn(Strict):
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


@endpoints_router.post("/{address}/pause", response=EndpointPauseOut, exclude_unset=True)
def pause_endpoint(request: HttpRequest, address: str, payload: ReasonIn):
    """Pause: new tickets queue (``enqueue``) or are refused with 409
    ``endpoint_paused`` (``reject``); no turn starts; a running one finishes.
    Pausing a paused endpoint answers ``changed: false`` and records nothing."""
    endpoint, changed = services.pause_endpoint(
        address=address, user=request.user, reason=payload.reason
    )
    return {**endpoint_payload(endpoint, user=request.user), "changed": changed}


@endpoints_router.post("/{address}/resume", response=EndpointPauseOut, exclude_unset=True)
def resume_endpoint(request: HttpRequest, address: str, payload: ReasonIn):
    """Resume: the queued tickets start again, oldest first. A quarantine
    stays. Resuming an endpoint that is not paused answers ``changed: false``."""
    endpoint, changed = services.resume_endpoint(
        address=address, user=request.user, reason=payload.reason
    )
    return {**endpoint_payload(endpoint, user=request.user), "changed": changed}


# --- Agents: the conversation and approvals (owners and staff) -----------------


def _owned_endpoint(request: HttpRequest, address: str) -> Endpoint:
    endpoint = resolve_endpoint(address)
    if not is_owner(request.user, endpoint):
        raise Forbidden("only the endpoint's owners may read its agent's conversation and calls")
    return endpoint


@endpoints_router.get("/{address}/conversation", response=ConversationOut)
def read_conversation(
    request: HttpRequest, address: str, limit: int = Query(50, ge=1, le=CONVERSATION_MAX_TURNS)
):
    """The agent's memory: its newest turns' messages, oldest first."""
    endpoint = _owned_endpoint(request, address)
    return {"endpoint": endpoint.address, "turns": conversation(endpoint, limit=limit)}


@endpoints_router.get("/{address}/approvals", response=list[PendingApprovalOut])
def list_approvals(request: HttpRequest, address: str):
    """Tool calls of the agent waiting for an owner's approval."""
    return pending_approvals(_owned_endpoint(request, address))


class DecisionIn(Strict):
    approve: bool
    reason: str = Field(min_length=1, max_length=2000)


@endpoints_router.post("/{address}/approvals/{ticket_id}/{call_id}", response=ApprovalDecidedOut)
def decide_approval(
    request: HttpRequest, address: str, ticket_id: str, call_id: str, payload: DecisionIn
):
    return decide_tool_call(
        address=address,
        ticket_id=ticket_id,
        call_id=call_id,
        approve=payload.approve,
        reason=payload.reason,
        user=request.user,
    )


# The directory's routes of an endpoint (generations, proposals, routes,
# aliases), after the runtime's: /api/v1/endpoints is this one router.
endpoints_router.add_router("", directory_router)


# --- Turns ----------------------------------------------------------------------
#
# Runners and agents answer with the credential issued to their exact turn
# (``turn.token`` in the envelope, ``Authorization: Bearer <token>``), never
# with a user's key: an owner's or staff key cannot forge a turn's result.


class TurnTokenAuth(HttpBearer):
    """The bearer must be the token of the turn the path names (its SHA-256
    compared in constant time with the turn's). ``required``: anything else
    is 403 (a user's key, another turn's token); otherwise it falls through
    to the next authenticator."""

    def __init__(self, *, required: bool) -> None:
        super().__init__()
        self.required = required

    def authenticate(self, request: HttpRequest, token: str):
        if not token:
            return None  # no credential at all: 401, as without the header
        match = request.resolver_match
        turn = turn_for_token(match.kwargs.get("turn_id") if match else None, token)
        if turn is None:
            if self.required:
                raise Forbidden(
                    "this route takes the credential issued to this turn (turn.token in its "
                    "envelope), not an API key"
                )
            return None
        request.turn_token = token  # to keep it out of what the agent posts
        return turn


TURN_ONLY = TurnTokenAuth(required=True)
TURN_OR_KEY = [TurnTokenAuth(required=False), ApiKeyAuth()]


def turn_payload(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.id),
        "endpoint": turn.endpoint.address,
        "ticket": str(turn.ticket_id),
        "seq": turn.seq,
        "generation": turn.generation,
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


@turns_router.get("/{turn_id}", response=TurnOut, auth=TURN_OR_KEY)
def read_turn(request: HttpRequest, turn_id: str):
    """With the turn's own token, or a key that may see the turn's ticket
    (submitter, owners, staff); anyone else gets 404, as for an unknown id."""
    if isinstance(request.auth, Turn):
        return turn_payload(request.auth)
    try:
        turn = Turn.objects.select_related("endpoint").filter(id=uuid.UUID(turn_id)).first()
    except ValueError:
        turn = None
    if turn is None or not visible_tickets(request.auth).filter(id=turn.ticket_id).exists():
        raise NotFound(f"turn {turn_id} not found")
    return turn_payload(turn)


def _reread(turn: Turn) -> dict[str, Any]:
    return turn_payload(Turn.objects.select_related("endpoint").get(id=turn.id))


@turns_router.post("/{turn_id}/heartbeat", response=HeartbeatOut, auth=TURN_ONLY)
def heartbeat(request: HttpRequest, turn_id: str, payload: SeqIn):
    turn: Turn = request.auth
    state = turns.heartbeat(turn_id=turn.id, seq=payload.seq, source="api", strict=True)
    return {**_reread(turn), "interrupt_requested": state.interrupted}


@turns_router.post("/{turn_id}/result", response=TurnOut, auth=TURN_ONLY)
def post_result(request: HttpRequest, turn_id: str, payload: ResultIn):
    turn: Turn = request.auth
    if payload.error is not None:
        outcome = turns.Outcome.failure(payload.error)
    else:
        outcome = turns.Outcome.success(payload.result, artifacts=payload.artifacts or [])
    outcome = runners.redact_token(outcome, request.turn_token)
    turns.finish_turn(turn_id=turn.id, seq=payload.seq, outcome=outcome, source="api", strict=True)
    return _reread(turn)


@turns_router.post("/{turn_id}/stopped", response=TurnOut, auth=TURN_ONLY)
def post_stopped(request: HttpRequest, turn_id: str, payload: StoppedIn):
    turn: Turn = request.auth
    outcome = turns.Outcome.stopped("agent_stop_receipt", {"detail": payload.detail})
    turns.finish_turn(
        turn_id=turn.id,
        seq=payload.seq,
        outcome=runners.redact_token(outcome, request.turn_token),
        source="api",
        strict=True,
    )
    return _reread(turn)


# GET /workers: the worker registry (staff only; it names hosts and pids).
workers_router = Router(tags=["workers"])


@workers_router.get("", response=WorkersOut)
def list_workers(request: HttpRequest):
    if not sees_workers(request.user):
        raise Forbidden("only staff may see the workers")
    return workers_overview()


class ConsumingIn(Strict):
    queue: str = Field(default="turns", min_length=1, max_length=200)
    consume: bool
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


@workers_router.post("/{name}/consuming", response=WorkerConsumingOut)
def set_consuming(request: HttpRequest, name: str, payload: ConsumingIn):
    """Stop (``consume: false``) or resume a worker's consuming of a queue
    (Celery's ``cancel_consumer`` / ``add_consumer``): staff only."""
    if not request.user.is_staff:
        raise Forbidden("only staff may stop or resume a worker's consuming")
    worker, answered = services.set_worker_consuming(
        worker=name,
        queue=payload.queue,
        consume=payload.consume,
        user=request.user,
        reason=payload.reason,
    )
    return {
        "worker": worker.name,
        "queue": payload.queue,
        "consume": payload.consume,
        "answered": answered,
        "consuming": worker.consuming,
    }
