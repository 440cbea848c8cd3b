"""Governed change: proposals of an endpoint configuration change and their
reviews. A proposal is a diff against a named generation, from an owner
directly or from a recovery lesson (``origin``); another owner of the
endpoint or staff approves or rejects it with a reason; an approval applies
it as the next generation (``services.change_generation``) in the same
transaction, conditional on the generation it was proposed against.

Proposals and reviews are append-only: a proposal's status is its one
review (the unique ``proposal`` column of ChangeReview is what two racing
reviewers meet), open while it has none."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from core import limits
from core.errors import (
    Invalid,
    InvalidTransition,
    NotFound,
    SecondPersonRequired,
    StaleGeneration,
)

from . import services
from .models import (
    GENERATION_FIELDS,
    ChangeProposal,
    ChangeReview,
    Endpoint,
    EndpointGeneration,
    ReviewVerdict,
)
from .selectors import is_owner, requires_second_person, resolve_endpoint


def _actor(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


def _reason(value: Any, what: str) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise Invalid(f"{what} needs a reason")
    if len(text) > limits.NOTE_CHARS:
        raise Invalid(f"the reason is longer than {limits.NOTE_CHARS} characters")
    return text


def governed_endpoint(address: str, user: AbstractBaseUser | None) -> Endpoint:
    """The endpoint, if ``user`` is one of its owners or staff; to anyone
    else its governance does not exist (404, as for an unknown address)."""
    endpoint = resolve_endpoint(address)
    if not is_owner(user, endpoint):
        raise NotFound(f"endpoint {address!r} not found")
    return endpoint


def visible_proposal(proposal_id: Any, user: AbstractBaseUser | None) -> ChangeProposal:
    """The proposal, if ``user`` owns its endpoint or is staff; else 404."""
    try:
        pid = uuid.UUID(str(proposal_id))
    except ValueError:
        pid = None
    proposal = (
        ChangeProposal.objects.select_related("endpoint", "proposer").filter(id=pid).first()
        if pid
        else None
    )
    if proposal is None or not is_owner(user, proposal.endpoint):
        raise NotFound(f"proposal {proposal_id} not found")
    return proposal


def propose_change(
    *,
    address: str,
    user: AbstractBaseUser,
    base_generation: int,
    changes: dict[str, Any],
    reason: str,
    origin: dict[str, Any] | None = None,
    restores: int | None = None,
) -> ChangeProposal:
    """Record a proposal: ``changes`` (generation fields) against
    ``base_generation``, which must be the current generation (an owner
    proposes against what runs; 409 ``stale_generation`` otherwise, with the
    diff since). A change that changes nothing is 400."""
    endpoint = governed_endpoint(address, user)
    reason = _reason(reason, "a proposal")
    services.validate_config_changes(changes)
    if not isinstance(base_generation, int) or base_generation < 1:
        raise Invalid("generation must be the number of the generation the change is against")
    if base_generation != endpoint.generation:
        raise StaleGeneration(
            f"{endpoint.address} is at generation {endpoint.generation}, not {base_generation}",
            generation=endpoint.generation,
            since=services.changes_since(endpoint, base_generation),
        )
    base = (
        EndpointGeneration.objects.filter(endpoint=endpoint, number=base_generation)
        .values_list("config", flat=True)
        .first()
    )
    if base is None:
        raise NotFound(f"generation {base_generation} of {endpoint.address} not found")
    diff = services.config_diff(base, {**base, **changes})
    if not diff:
        raise Invalid("the proposed change changes nothing")
    return ChangeProposal.objects.create(
        endpoint=endpoint,
        base_generation=base_generation,
        changes={name: changes[name] for name in diff},
        diff=diff,
        reason=reason,
        proposer=user,
        origin=origin or {},
        restores=restores,
        created_at=timezone.now(),
    )


def propose_rollback(
    *, address: str, user: AbstractBaseUser, to_generation: int, base_generation: int, reason: str
) -> ChangeProposal:
    """A rollback: a proposal whose content is an earlier generation's."""
    endpoint = governed_endpoint(address, user)
    earlier = (
        EndpointGeneration.objects.filter(endpoint=endpoint, number=to_generation)
        .values_list("config", flat=True)
        .first()
    )
    if earlier is None:
        raise NotFound(f"generation {to_generation} of {endpoint.address} not found")
    return propose_change(
        address=address,
        user=user,
        base_generation=base_generation,
        changes={name: earlier[name] for name in GENERATION_FIELDS if name in earlier},
        reason=reason,
        restores=to_generation,
    )


def review_proposal(
    *, proposal_id: Any, user: AbstractBaseUser, approve: bool, reason: str
) -> ChangeReview:
    """Approve or reject a proposal, with a reason.

    1. The proposal must be visible to ``user`` (an owner of its endpoint or
       staff; 404 otherwise) and have no review yet (409).
    2. An approval by the proposer, where the endpoint requires a second
       person, is refused (403 ``second_person_required``).
    3. Approval applies the change as the next generation, conditional on
       the proposal's base generation (409 ``stale_generation`` with the
       diff since: nothing is written, the proposal stays open), and
       records the review naming that generation: one transaction.
    """
    proposal = visible_proposal(proposal_id, user)
    reason = _reason(reason, "a review")
    if approve and proposal.proposer_id == user.pk and requires_second_person(proposal.endpoint):
        raise SecondPersonRequired(
            "this endpoint's changes need a second person: another owner or staff approves"
        )
    verdict = ReviewVerdict.APPROVED if approve else ReviewVerdict.REJECTED
    try:
        with transaction.atomic():
            # The endpoint row first (change_generation takes it too): two
            # reviews of one endpoint's proposals take turns here.
            Endpoint.objects.select_for_update().filter(id=proposal.endpoint_id).first()
            done = ChangeReview.objects.filter(proposal=proposal).first()
            if done is not None:
                raise InvalidTransition(
                    f"proposal {proposal.id} was already {done.verdict}", state=done.verdict
                )
            number = None
            if approve:
                generation = services.change_generation(
                    endpoint_id=proposal.endpoint_id,
                    changes=proposal.changes,
                    actor=_actor(user),
                    reason=f"{proposal.reason} (proposed by {proposal.proposer.get_username()}; "
                    f"approved: {reason})",
                    expected_generation=proposal.base_generation,
                    proposal_id=proposal.id,
                    restores=proposal.restores,
                )
                if generation is None:
                    raise Invalid("the proposed change changes nothing now")
                number = generation.number
            return ChangeReview.objects.create(
                proposal=proposal,
                reviewer=user,
                verdict=verdict,
                reason=reason,
                generation=number,
                at=timezone.now(),
            )
    except IntegrityError:
        # Another review of the same proposal committed first.
        raise InvalidTransition(f"proposal {proposal.id} was already reviewed") from None
