"""Endpoint and turn routes: parse, call one service, render."""

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
from tickets.selectors import iso, visible_tickets

from . import generation_selectors, proposals, runners, runtime, services
from .agents.limits import CONVERSATION_MAX_TURNS
from .models import Endpoint, Turn
from .schemas import (
    ApprovalDecidedOut,
    ConversationOut,
    EndpointOut,
    EndpointPauseOut,
    GenerationDetailOut,
    GenerationsOut,
    HeartbeatOut,
    PendingApprovalOut,
    ProposalOut,
    RouteGenerationOut,
    TurnOut,
    WorkerConsumingOut,
    WorkersOut,
)
from .selectors import (
    endpoint_payload,
    is_owner,
    resolve_endpoint,
    turn_for_token,
    workers_overview,
)

router = Router(tags=["endpoints"])
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
    busy_policy: Literal["enqueue", "reject"] | None = None
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
    busy_policy: Literal["enqueue", "reject"] | None = None
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
@router.post("", response={201: EndpointOut}, exclude_unset=True)
def create_endpoint(request: HttpRequest, payload: EndpointIn):
    require_staff(request)
    fields = payload.model_dump(exclude_none=True)
    endpoint = services.create_endpoint(**fields, actor=f"user:{request.user.username}")
    return Status(201, endpoint_payload(endpoint, user=request.user))


@router.get("", response=list[EndpointOut], exclude_unset=True)
def list_endpoints(request: HttpRequest):
    return [endpoint_payload(e, user=request.user) for e in Endpoint.objects.order_by("address")]


@router.get("/{address}", response=EndpointOut, exclude_unset=True)
def get_endpoint(request: HttpRequest, address: str):
    return endpoint_payload(resolve_endpoint(address), user=request.user)


@router.patch("/{address}", response=EndpointOut, exclude_unset=True)
def patch_endpoint(request: HttpRequest, address: str, payload: EndpointPatch):
    require_staff(request)
    changes = payload.model_dump(exclude_unset=True)
    reason = changes.pop("reason", None) or ""
    expected = changes.pop("generation", None)
    endpoint = services.update_endpoint(
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


@router.post("/{address}/pause", response=EndpointPauseOut, exclude_unset=True)
def pause_endpoint(request: HttpRequest, address: str, payload: ReasonIn):
    """Pause: new tickets queue (``enqueue``) or are refused with 409
    ``endpoint_paused`` (``reject``); no turn starts; a running one finishes.
    Pausing a paused endpoint answers ``changed: false`` and records nothing."""
    endpoint, changed = services.pause_endpoint(
        address=address, user=request.user, reason=payload.reason
    )
    return {**endpoint_payload(endpoint, user=request.user), "changed": changed}


@router.post("/{address}/resume", response=EndpointPauseOut, exclude_unset=True)
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


@router.get("/{address}/conversation", response=ConversationOut)
def read_conversation(
    request: HttpRequest, address: str, limit: int = Query(50, ge=1, le=CONVERSATION_MAX_TURNS)
):
    """The agent's memory: its newest turns' messages, oldest first."""
    from .agents.selectors import conversation

    endpoint = _owned_endpoint(request, address)
    return {"endpoint": endpoint.address, "turns": conversation(endpoint, limit=limit)}


@router.get("/{address}/approvals", response=list[PendingApprovalOut])
def list_approvals(request: HttpRequest, address: str):
    """Tool calls of the agent waiting for an owner's approval."""
    from .agents.selectors import pending_approvals

    return pending_approvals(_owned_endpoint(request, address))


class DecisionIn(Strict):
    approve: bool
    reason: str = Field(min_length=1, max_length=2000)


@router.post("/{address}/approvals/{ticket_id}/{call_id}", response=ApprovalDecidedOut)
def decide_approval(
    request: HttpRequest, address: str, ticket_id: str, call_id: str, payload: DecisionIn
):
    from .agents.services import decide_tool_call

    return decide_tool_call(
        address=address,
        ticket_id=ticket_id,
        call_id=call_id,
        approve=payload.approve,
        reason=payload.reason,
        user=request.user,
    )


# --- Governed change: generations, proposals, reviews, routes (owners and staff) --------------
#
# To anyone but the endpoint's owners and staff these do not exist (404).


class ProposalIn(Strict):
    # The generation the change is made against (the current one).
    generation: int = Field(ge=1)
    changes: dict[str, Any]
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


class RollbackIn(Strict):
    to_generation: int = Field(ge=1)
    generation: int = Field(ge=1)
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


class ReviewIn(Strict):
    approve: bool
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


class MoveAliasIn(Strict):
    to: str = Field(min_length=1, max_length=limits.ADDRESS_CHARS)
    reason: str = Field(min_length=1, max_length=limits.NOTE_CHARS)


@router.get("/{address}/generations", response=GenerationsOut)
def list_generations(request: HttpRequest, address: str, limit: int = Query(50, ge=1, le=500)):
    """The endpoint's generations, newest first, and the outcomes of the
    current one beside the one before."""
    endpoint = proposals.governed_endpoint(address, request.user)
    return {
        "endpoint": endpoint.address,
        "generation": endpoint.generation,
        "generations": [
            generation_selectors.generation_payload(g)
            for g in generation_selectors.generations_of(endpoint, limit=limit)
        ],
        "outcomes": generation_selectors.side_by_side(endpoint),
    }


@router.get("/{address}/generations/{number}", response=GenerationDetailOut)
def get_generation(request: HttpRequest, address: str, number: int):
    endpoint = proposals.governed_endpoint(address, request.user)
    generation = endpoint.generations.filter(number=number).first()
    if generation is None:
        raise NotFound(f"generation {number} of {endpoint.address} not found")
    return {
        "endpoint": endpoint.address,
        "generation": generation_selectors.generation_payload(generation),
        "outcomes": generation_selectors.side_by_side(endpoint, number),
    }


@router.get("/{address}/proposals", response=list[ProposalOut])
def list_proposals(request: HttpRequest, address: str):
    endpoint = proposals.governed_endpoint(address, request.user)
    return [
        generation_selectors.proposal_payload(p, user=request.user)
        for p in generation_selectors.proposals_of(endpoint)
    ]


@router.post("/{address}/proposals", response={201: ProposalOut})
def propose(request: HttpRequest, address: str, payload: ProposalIn):
    proposal = proposals.propose_change(
        address=address,
        user=request.user,
        base_generation=payload.generation,
        changes=payload.changes,
        reason=payload.reason,
    )
    return Status(201, generation_selectors.proposal_detail(proposal, user=request.user))


@router.post("/{address}/rollback", response={201: ProposalOut})
def propose_rollback(request: HttpRequest, address: str, payload: RollbackIn):
    """A proposal whose content is an earlier generation's."""
    proposal = proposals.propose_rollback(
        address=address,
        user=request.user,
        to_generation=payload.to_generation,
        base_generation=payload.generation,
        reason=payload.reason,
    )
    return Status(201, generation_selectors.proposal_detail(proposal, user=request.user))


@router.get("/{address}/routes", response=list[RouteGenerationOut])
def list_routes(request: HttpRequest, address: str):
    """Route generations of the aliases that point, or pointed, here."""
    endpoint = proposals.governed_endpoint(address, request.user)
    return [generation_selectors.route_payload(r) for r in generation_selectors.routes_of(endpoint)]


@router.post("/{address}/aliases/{alias}/move", response={201: RouteGenerationOut})
def move_alias(request: HttpRequest, address: str, alias: str, payload: MoveAliasIn):
    """Point one of this endpoint's aliases at another endpoint: the owners
    (or staff) of both move it."""
    source = proposals.governed_endpoint(address, request.user)
    if not source.aliases.filter(alias=alias).exists():
        raise NotFound(f"alias {alias!r} of {source.address} not found")
    proposals.governed_endpoint(payload.to, request.user)
    route = services.move_alias(
        alias=alias,
        to_address=payload.to,
        reason=payload.reason,
        actor=f"user:{request.user.username}",
    )
    return Status(201, generation_selectors.route_payload(route))


proposals_router = Router(tags=["proposals"])


@proposals_router.get("", response=list[ProposalOut])
def review_queue(request: HttpRequest):
    """Open proposals on the endpoints the caller owns (staff: all)."""
    return [
        generation_selectors.proposal_payload(p, user=request.user)
        for p in generation_selectors.review_queue(request.user)
    ]


@proposals_router.get("/{proposal_id}", response=ProposalOut)
def get_proposal(request: HttpRequest, proposal_id: str):
    proposal = proposals.visible_proposal(proposal_id, request.user)
    return generation_selectors.proposal_detail(proposal, user=request.user)


@proposals_router.post("/{proposal_id}/review", response={201: ProposalOut})
def review(request: HttpRequest, proposal_id: str, payload: ReviewIn):
    """Approve (applied as the next generation) or reject, with a reason."""
    done = proposals.review_proposal(
        proposal_id=proposal_id, user=request.user, approve=payload.approve, reason=payload.reason
    )
    proposal = proposals.visible_proposal(done.proposal_id, request.user)
    return Status(201, generation_selectors.proposal_detail(proposal, user=request.user))


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
    state = runtime.heartbeat(turn_id=turn.id, seq=payload.seq, source="api", strict=True)
    return {**_reread(turn), "interrupt_requested": state.interrupted}


@turns_router.post("/{turn_id}/result", response=TurnOut, auth=TURN_ONLY)
def post_result(request: HttpRequest, turn_id: str, payload: ResultIn):
    turn: Turn = request.auth
    if payload.error is not None:
        outcome = runtime.Outcome.failure(payload.error)
    else:
        outcome = runtime.Outcome.success(payload.result, artifacts=payload.artifacts or [])
    outcome = runners.redact_token(outcome, request.turn_token)
    runtime.finish_turn(
        turn_id=turn.id, seq=payload.seq, outcome=outcome, source="api", strict=True
    )
    return _reread(turn)


@turns_router.post("/{turn_id}/stopped", response=TurnOut, auth=TURN_ONLY)
def post_stopped(request: HttpRequest, turn_id: str, payload: StoppedIn):
    turn: Turn = request.auth
    outcome = runtime.Outcome.stopped("agent_stop_receipt", {"detail": payload.detail})
    runtime.finish_turn(
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
    if not request.user.is_staff:
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
