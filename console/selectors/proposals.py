"""A change proposal's page: the proposal, its diff against the generation
it was made on, what changed since, its review. Only its endpoint's owners
and staff see it (``endpoints.proposals.visible_proposal``); anyone else
gets 404."""

from __future__ import annotations

from typing import Any

from django.http import Http404

from core.errors import NotFound
from endpoints import generation_selectors, proposals
from endpoints.models import ChangeProposal


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
