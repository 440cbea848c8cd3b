"""A change proposal's page: the proposal, its diff against the generation
it was made on, what changed since, its review. Only its endpoint's owners
and staff see it (``endpoints.proposals.visible_proposal``); anyone else
gets 404."""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.http import Http404

from core.errors import NotFound
from endpoints import generation_selectors, proposals
from endpoints.models import ChangeProposal
from endpoints.selectors import owned_endpoint_ids


def visible_proposal(proposal_id, *, user) -> ChangeProposal:
    try:
        return proposals.visible_proposal(proposal_id, user)
    except NotFound as exc:
        raise Http404(exc.detail) from None


def proposal_page(proposal: ChangeProposal, *, user) -> dict[str, Any]:
    origin = proposal.origin or {}
    return {
        "proposal": proposal,
        "p": generation_selectors.proposal_detail(proposal, user=user),
        "origin_case": origin.get("case"),
        "origin_lesson": origin.get("lesson"),
    }


# The states a proposal is listed by (generation_selectors.proposal_status).
PROPOSAL_STATES = ("open", "stale", "approved", "rejected")
LIST_CAP = 200


def proposal_list_page(*, user, state: str) -> dict[str, Any]:
    """The proposals of the endpoints ``user`` owns (staff: every
    endpoint), newest first, in ``state`` if given: the review queue and its
    history. A state that is not one is the page's ``error`` (answered 400).
    Owners and staff only, as for one proposal: nobody else sees any."""
    error, rows = None, []
    if state and state not in PROPOSAL_STATES:
        error = f"state must be one of {', '.join(PROPOSAL_STATES)}, not {state!r}"
    else:
        proposals_ = ChangeProposal.objects.select_related(
            "endpoint", "proposer", "review__reviewer"
        )
        owned = owned_endpoint_ids(user)
        if owned is not None:
            proposals_ = proposals_.filter(endpoint_id__in=owned)
        # The status in SQL, as proposal_status reads it: the review's
        # verdict, else open while the endpoint is still at the proposal's
        # generation, else stale.
        if state in ("approved", "rejected"):
            proposals_ = proposals_.filter(review__verdict=state)
        elif state == "open":
            proposals_ = proposals_.filter(
                review__isnull=True, base_generation=F("endpoint__generation")
            )
        elif state == "stale":
            proposals_ = proposals_.filter(review__isnull=True).exclude(
                base_generation=F("endpoint__generation")
            )
        rows = [
            generation_selectors.proposal_payload(p, user=user)
            for p in proposals_.order_by("-created_at")[:LIST_CAP]
        ]
    return {
        "proposals": rows,
        "state": state,
        "states": PROPOSAL_STATES,
        "error": error,
        "cap": LIST_CAP,
    }
