"""The endpoint list and an endpoint's page: its record as the API shows
it to the user, lock holder, pauses, recent turns, charts and cases; for an
agent endpoint its conversation and pending approvals; for its owners and
staff its governed change (generations, outcomes, proposals, routes).
Everyone sees endpoints; what only owners and staff see is decided by
``endpoints.selectors`` (``sees_configuration``, ``is_owner``,
``pause_events``, ``visible_turns``) and the governance reads."""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from django.http import Http404

from core.errors import NotFound
from endpoints import generation_selectors, proposals, runner_spec
from endpoints.models import Endpoint, EndpointAlias
from endpoints.selectors import is_owner, pause_events, sees_configuration
from recovery.models import CaseState, RecoveryCase
from recovery.selectors import visible_cases
from runtime.agents import selectors as agent_selectors
from runtime.selectors import endpoint_payload, visible_turns
from tickets import selectors as ticket_selectors
from tickets.models import Ticket, TicketState, Turn
from tickets.selectors import visible_tickets

from .charts import chart_range, endpoint_hour, last_hour
from .schedules import endpoint_schedules

CONVERSATION_TURNS = 20


def endpoint_list_page(*, user) -> dict[str, Any]:
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    return {"endpoints": endpoint_rows(user=user), "live_token": live_token}


def endpoint_page(endpoint: Endpoint, *, user, span: str | None) -> dict[str, Any]:
    """The endpoint page's live region: what everyone sees, with what its
    owners and staff see besides (its agent's conversation, pauses, all its
    turns and cases)."""
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    holder = lock_holder(endpoint)
    span = chart_range(span)
    owner = is_owner(user, endpoint)
    return {
        "endpoint": endpoint,
        "e": endpoint_payload(endpoint, user=user),
        "sees_configuration": sees_configuration(user, endpoint),
        "can_see_cases": owner,
        "can_pause": owner,
        "pause_events": pause_events(endpoint, user=user),
        "holder": holder,
        "holder_visible": holder is not None
        and visible_tickets(user).filter(id=holder.ticket_id).exists(),
        "turns": visible_turns(endpoint, user=user),
        "hour": endpoint_hour(endpoint, span=span),
        "throughput": last_hour(user=user, span=span, endpoint=endpoint),
        "cases": endpoint_cases(endpoint, user=user),
        "schedules": endpoint_schedules(endpoint, user=user) if owner else [],
        "live_token": live_token,
        # Everyone who may submit needs to know whether the agent keeps what
        # they tell it to themselves (runtime/agents/memory.py).
        "memory": runner_spec.memory_mode(endpoint.runner),
        **(agent(endpoint) if owner else {}),
    }


def agent(endpoint: Endpoint) -> dict[str, Any]:
    """An agent endpoint's conversation and pending approvals (the caller
    shows them to its owners and staff only, as the API does)."""
    if endpoint.runner.get("kind") != "agent":
        return {}
    turns = agent_selectors.conversation(endpoint, limit=CONVERSATION_TURNS)
    for turn in turns:
        turn["lines"] = agent_selectors.message_lines(turn["messages"])
    return {
        "agent": True,
        "conversation": turns,
        "approvals": agent_selectors.pending_approvals(endpoint),
    }


def governance(endpoint: Endpoint, *, user) -> dict[str, Any]:
    """What the endpoint page shows its owners and staff of its governed
    change: the generations (newest first, with diffs), the current one's
    outcomes beside the one before, proposals and routes. Nothing to anyone
    else."""
    if not is_owner(user, endpoint):
        return {}
    return {
        "governs": True,
        "generations": generation_selectors.generations_of(endpoint, limit=20),
        "outcomes": generation_selectors.side_by_side(endpoint),
        "proposals": [
            generation_selectors.proposal_payload(p, user=user)
            for p in generation_selectors.proposals_of(endpoint, limit=20)
        ],
        "routes": [
            generation_selectors.route_payload(r)
            for r in generation_selectors.routes_of(endpoint, limit=20)
        ],
    }


def governed_endpoint(address: str, *, user) -> Endpoint:
    """The endpoint, if ``user`` may change it (its owners, staff); 404
    otherwise, as for an unknown address."""
    try:
        return proposals.governed_endpoint(address, user)
    except NotFound as exc:
        raise Http404(exc.detail) from None


def endpoint_rows(*, user) -> list[Endpoint]:
    """All endpoints (everyone sees endpoints) with their lock, queued count
    and open case (when the user may see it). Endpoints are configuration
    (few rows); the queued count reads the partial index of queued tickets,
    one grouped query for all endpoints."""
    endpoints = list(Endpoint.objects.select_related("lock").order_by("address"))
    queued = dict(
        Ticket.objects.filter(state=TicketState.QUEUED)
        .values_list("endpoint_id")
        .annotate(n=Count("id"))
        .values_list("endpoint_id", "n")
    )
    open_cases = dict(
        visible_cases(user).filter(state=CaseState.OPEN).values_list("endpoint_id", "id")
    )
    for endpoint in endpoints:
        endpoint.queued = queued.get(endpoint.id, 0)
        endpoint.open_case = open_cases.get(endpoint.id)
    return endpoints


def get_endpoint(address: str) -> Endpoint:
    endpoint = (
        Endpoint.objects.filter(address=address).select_related("lock", "lock__holder").first()
    )
    if endpoint is None:
        alias = EndpointAlias.objects.filter(alias=address).select_related("endpoint").first()
        if alias is None:
            raise Http404(f"endpoint {address} not found")
        endpoint = alias.endpoint
    return endpoint


def lock_holder(endpoint: Endpoint) -> Turn | None:
    """The turn holding the endpoint's lock, or None (every endpoint has its
    lock row from creation; a missing one reads as free)."""
    lock = getattr(endpoint, "lock", None)
    return lock.holder if lock is not None and lock.holder_id else None


def endpoint_cases(endpoint: Endpoint, *, user, limit: int = 10) -> list[RecoveryCase]:
    return list(visible_cases(user).filter(endpoint_id=endpoint.id).order_by("-opened_at")[:limit])


def may_pause(endpoint: Endpoint, *, user) -> bool:
    """May ``user`` pause or resume the endpoint? Its owners and staff."""
    return is_owner(user, endpoint)
