"""Reads of governed change: generations with their diffs and outcomes,
proposals with their status, the review queue. The API and the console
render these; visibility (owners and staff) is decided by the caller through
``proposals.governed_endpoint`` / ``visible_proposal`` or here by the user."""

from __future__ import annotations

from typing import Any

from django.db import connection

from core.times import iso

from .models import ChangeProposal, ChangeReview, Endpoint, EndpointGeneration
from .selectors import owned_endpoint_ids, requires_second_person

# How a generation's turns ended, and their run-time percentiles, are read
# over at most this many of its newest turns: the page's cost stays bounded
# however long the generation ran. Its count of turns is exact (seq range).
OUTCOME_SAMPLE = 1000

# Turns whose end is evidenced (a finish, a proven stop): the only ones a
# run time is figured from. An uncertain turn has no end, and an
# unresolved one's ended_at is the owner's decision, not when it stopped;
# both are counted apart (quarantined).
ENDED_ON_EVIDENCE = ("completed", "failed", "stopped")


def generation_payload(generation: EndpointGeneration) -> dict[str, Any]:
    return {
        "number": generation.number,
        "config": generation.config,
        "changes": generation.changes,
        "actor": generation.actor,
        "reason": generation.reason,
        "proposal": str(generation.proposal_id) if generation.proposal_id else None,
        "restores": generation.restores,
        "first_seq": generation.first_seq,
        "at": iso(generation.at),
    }


def generations_of(endpoint: Endpoint, *, limit: int = 50) -> list[EndpointGeneration]:
    """The newest generations first."""
    return list(EndpointGeneration.objects.filter(endpoint=endpoint).order_by("-number")[:limit])


_GENERATIONS_SQL = """
SELECT number, first_seq,
    COALESCE(lead(first_seq) OVER (ORDER BY number) - 1, 9223372036854775807) AS last_seq
FROM endpoints_endpointgeneration
WHERE endpoint_id = %(endpoint)s AND number = ANY(%(numbers)s)
   OR endpoint_id = %(endpoint)s AND number - 1 = ANY(%(numbers)s)
"""

# One generation's newest turns, by its seq range given as values: with the
# bounds known the planner walks the (endpoint, seq) index backwards and
# stops at the limit (with the bounds from a join it guessed a few hundred
# rows and read every turn of the endpoint to sort them).
_SAMPLE_SQL = """
SELECT count(*),
    count(*) FILTER (WHERE s.state = 'completed'),
    count(*) FILTER (WHERE s.state = 'failed'),
    count(*) FILTER (WHERE s.state = 'stopped'),
    count(*) FILTER (WHERE s.state IN ('uncertain', 'unresolved')),
    count(*) FILTER (WHERE s.state IN ('running', 'interrupting')),
    count(*) FILTER (WHERE s.state = ANY(%(known)s) AND s.ended_at IS NOT NULL),
    percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (
        ORDER BY extract(epoch FROM s.ended_at - s.started_at))
        FILTER (WHERE s.state = ANY(%(known)s) AND s.ended_at IS NOT NULL)
FROM (SELECT u.state, u.started_at, u.ended_at FROM runtime_turn u
      WHERE u.endpoint_id = %(endpoint)s AND u.seq BETWEEN %(first)s AND %(last)s
      ORDER BY u.seq DESC LIMIT %(sample)s) s
"""


def outcomes(endpoint: Endpoint, numbers: list[int]) -> dict[int, dict[str, Any]]:
    """Per generation: its turns (exact: a generation's turns are the seq
    range from its ``first_seq`` to the next one's, and an endpoint's seqs
    have no gaps), and over its newest ``OUTCOME_SAMPLE`` of them
    (``sampled``): how they ended (succeeded, failed, timed out = interrupted
    and proven stopped, quarantined = never proven stopped), still running,
    and p50 / p95 run time of those that ended on evidence (``measured``;
    a quarantined turn's end is not known). Reads at most
    ``OUTCOME_SAMPLE`` rows of the (endpoint, seq) index per generation,
    however many turns it ran (counting them all would grow with the
    ledger)."""
    if not numbers:
        return {}
    result = {}
    with connection.cursor() as cur:
        cur.execute(_GENERATIONS_SQL, {"endpoint": endpoint.id, "numbers": list(numbers)})
        ranges = [row for row in cur.fetchall() if row[0] in numbers]
        for number, first, last in ranges:
            cur.execute(
                _SAMPLE_SQL,
                {
                    "endpoint": endpoint.id,
                    "first": first,
                    "last": last,
                    "sample": OUTCOME_SAMPLE,
                    "known": list(ENDED_ON_EVIDENCE),
                },
            )
            sampled, ok, failed, timed_out, quarantined, running, measured, pct = cur.fetchone()
            p50, p95 = pct if pct else (None, None)
            result[number] = {
                "generation": number,
                "turns": max(0, min(last, endpoint.turn_seq) - first + 1),
                "sampled": sampled,
                "succeeded": ok,
                "failed": failed,
                "timed_out": timed_out,
                "quarantined": quarantined,
                "running": running,
                "measured": measured,
                "p50_s": None if p50 is None else round(p50, 3),
                "p95_s": None if p95 is None else round(p95, 3),
            }
    return result


def side_by_side(endpoint: Endpoint, number: int | None = None) -> list[dict[str, Any]]:
    """Generation ``number`` (default: the current one) and the one before,
    newest first, with their outcomes."""
    number = number or endpoint.generation
    numbers = [n for n in (number, number - 1) if n >= 1]
    found = outcomes(endpoint, numbers)
    empty = dict.fromkeys(
        (
            "turns",
            "sampled",
            "succeeded",
            "failed",
            "timed_out",
            "quarantined",
            "running",
            "measured",
        ),
        0,
    )
    return [
        found.get(n) or {"generation": n, **empty, "p50_s": None, "p95_s": None} for n in numbers
    ]


def proposal_status(proposal: ChangeProposal, review: ChangeReview | None = None) -> str:
    """approved | rejected | open | stale (open, but the endpoint moved past
    the generation it was proposed against: approving it is refused)."""
    review = review if review is not None else review_of(proposal)
    if review is not None:
        return review.verdict
    if proposal.base_generation != proposal.endpoint.generation:
        return "stale"
    return "open"


def review_of(proposal: ChangeProposal) -> ChangeReview | None:
    try:
        return proposal.review
    except ChangeReview.DoesNotExist:
        return None


def proposal_payload(proposal: ChangeProposal, *, user=None) -> dict[str, Any]:
    from .services import changes_since

    review = review_of(proposal)
    status = proposal_status(proposal, review)
    endpoint = proposal.endpoint
    return {
        "id": str(proposal.id),
        "endpoint": endpoint.address,
        "base_generation": proposal.base_generation,
        "current_generation": endpoint.generation,
        "changes": proposal.changes,
        "diff": proposal.diff,
        "reason": proposal.reason,
        "proposer": proposal.proposer.get_username(),
        "origin": proposal.origin,
        "restores": proposal.restores,
        "created_at": iso(proposal.created_at),
        "status": status,
        # What changed since the proposal's generation: what a reviewer of a
        # stale proposal needs to see.
        "since": changes_since(endpoint, proposal.base_generation) if status == "stale" else None,
        "second_person_required": requires_second_person(endpoint),
        "may_approve": (
            user is not None
            and status == "open"
            and not (proposal.proposer_id == user.pk and requires_second_person(endpoint))
        ),
        "review": (
            {
                "id": str(review.id),
                "reviewer": review.reviewer.get_username(),
                "verdict": review.verdict,
                "reason": review.reason,
                "generation": review.generation,
                "at": iso(review.at),
            }
            if review
            else None
        ),
    }


def proposal_detail(proposal: ChangeProposal, *, user=None) -> dict[str, Any]:
    """The proposal, and once approved the outcomes of the generation it
    made beside the one before: did it help?"""
    body = proposal_payload(proposal, user=user)
    review = body["review"]
    if review and review["generation"]:
        body["outcomes"] = side_by_side(proposal.endpoint, review["generation"])
    return body


def route_payload(route) -> dict[str, Any]:
    return {
        "alias": route.alias,
        "number": route.number,
        "endpoint": route.endpoint.address if route.endpoint_id else None,
        "actor": route.actor,
        "reason": route.reason,
        "at": iso(route.at),
    }


def routes_of(endpoint: Endpoint, *, limit: int = 50) -> list:
    """Route generations of the aliases that point, or pointed, here."""
    from .models import RouteGeneration

    aliases = RouteGeneration.objects.filter(endpoint=endpoint).values("alias")
    return list(
        RouteGeneration.objects.filter(alias__in=aliases)
        .select_related("endpoint")
        .order_by("-at", "-number")[:limit]
    )


def proposals_of(endpoint: Endpoint, *, limit: int = 50) -> list[ChangeProposal]:
    return list(
        ChangeProposal.objects.filter(endpoint=endpoint)
        .select_related("endpoint", "proposer", "review__reviewer")
        .order_by("-created_at")[:limit]
    )


def review_queue(user, *, limit: int = 50) -> list[ChangeProposal]:
    """Proposals without a review on the endpoints ``user`` owns (staff:
    every endpoint), oldest first."""
    owned = owned_endpoint_ids(user)
    # The (absent) review joined too: the payloads then ask nothing more.
    rows = ChangeProposal.objects.filter(review__isnull=True).select_related(
        "endpoint", "proposer", "review"
    )
    if owned is not None:
        rows = rows.filter(endpoint_id__in=owned)
    return list(rows.order_by("created_at")[:limit])


def proposals_from_lesson(lesson_id: Any) -> list[ChangeProposal]:
    return list(
        ChangeProposal.objects.filter(origin__lesson=str(lesson_id))
        .select_related("endpoint", "proposer", "review__reviewer")
        .order_by("created_at")
    )


def proposals_from_lessons(lesson_ids: list[Any]) -> dict[str, list[ChangeProposal]]:
    """The proposals made from each of ``lesson_ids`` (by lesson id as a
    string, oldest first), in one query for a page of lessons."""
    by_lesson: dict[str, list[ChangeProposal]] = {}
    rows = ChangeProposal.objects.filter(
        origin__lesson__in=[str(lesson_id) for lesson_id in lesson_ids]
    ).select_related("endpoint", "proposer", "review__reviewer")
    for proposal in rows.order_by("created_at"):
        by_lesson.setdefault(proposal.origin["lesson"], []).append(proposal)
    return by_lesson
