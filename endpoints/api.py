"""The directory's routes: an endpoint's governed change (generations,
proposals and their review, rollbacks, route generations and alias moves).
Parse, call one service, render. The endpoint's own record, with its lock
and queue, is served by the runtime (runtime/api.py), whose router of
/api/v1/endpoints mounts this one."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Status

from core import limits
from core.errors import NotFound
from core.schemas import StrictTyped

from . import generation_selectors, proposals, services
from .schemas import GenerationDetailOut, GenerationsOut, ProposalOut, RouteGenerationOut

# Tagged "endpoints" by the one router of /api/v1/endpoints that mounts it
# (runtime.api.endpoints_router): a tag of its own would be listed twice.
router = Router()

# Strict types: a number or flag sent as a string ("5", "true") is 422, not coerced.
Strict = StrictTyped


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
