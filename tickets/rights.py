"""Children carry their submitter's rights: where a ticket the runtime
admits for another ticket may go (docs/reference/api.md, "Who may submit where").

A runner chooses its children's endpoints, and a runner may take them from
its ticket's input: the runtime admitting them with no check would let
anyone who may submit to a research-style endpoint reach every endpoint
whose owners restricted who submits. So a child (of a wait, or of an agent's
later round) goes to a restricted endpoint only when

1. the trace's submitter may submit there (``may_submit``): the submitter of
   the nearest ticket up the parent chain that a person admitted (the root,
   unless someone admitted under a parent they may see: then theirs), or
   nobody when the chain reaches a root the runtime or an operator's script
   admitted; or
2. the asking endpoint's owners named it in the generation the asking turn
   ran under (its runner's ``delegate_to``: configuration an owner or staff
   approved, never the ticket's input) and may submit there themselves
   (``owners_may_submit``).

A child's ``return_to`` naming the asking endpoint itself is the way its
callback comes home, not a submission, and is not checked. Admission asks
this only for a restricted endpoint (``claimcheck_admit`` answers
``restricted``), so an open one costs nothing more.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models.expressions import RawSQL

from core.errors import Forbidden
from endpoints.models import Endpoint, EndpointGeneration
from endpoints.selectors import may_submit, owners_may_submit

from .models import Ticket


@dataclass(frozen=True)
class AskingTurn:
    """The turn a runtime admission is for: its endpoint and the generation
    it ran under (``Turn.generation``)."""

    endpoint_id: int
    generation: int


# Up the parent chain from the parent until a ticket a person admitted (its
# submitter) or the root. Bounded by the trace's depth; parents never change.
_SUBMITTER_SQL = f"""
WITH RECURSIVE up AS (
    SELECT id, parent_id, submitted_by_id FROM {Ticket._meta.db_table} WHERE id = %s
    UNION ALL
    SELECT t.id, t.parent_id, t.submitted_by_id
    FROM {Ticket._meta.db_table} t JOIN up ON t.id = up.parent_id
    WHERE up.submitted_by_id IS NULL
)
SELECT submitted_by_id FROM up WHERE submitted_by_id IS NOT NULL
"""


def trace_submitter(parent_id: uuid.UUID):
    """The user whose rights a child of ``parent_id`` carries, or None (one
    query: the walk up the chain as the user's subquery)."""
    return get_user_model().objects.filter(id__in=RawSQL(_SUBMITTER_SQL, [parent_id])).first()


def named_by_owners(asked_by: AskingTurn, target: Endpoint, requested: str) -> bool:
    """Did the asking endpoint's generation name the target in ``delegate_to``
    (as asked, or by its canonical address)?"""
    config = (
        EndpointGeneration.objects.filter(
            endpoint_id=asked_by.endpoint_id, number=asked_by.generation
        )
        .values_list("config", flat=True)
        .first()
    )
    runner = (config or {}).get("runner")
    named = runner.get("delegate_to") if isinstance(runner, dict) else None
    if not isinstance(named, list):
        return False
    return requested in named or target.address in named


def require_child_rights(
    *,
    asked_by: AskingTurn,
    parent_id: uuid.UUID,
    target: Endpoint,
    requested: str,
    return_to: bool = False,
) -> None:
    """``Forbidden`` unless a child of ``parent_id`` asked for by
    ``asked_by`` may go to ``target`` (``requested``: the address as the
    runner gave it, which its ticket's viewers already know; the error
    names that, never the canonical address behind an alias).
    ``return_to``: ``target`` is the child's return_to."""
    if not target.submit_restricted:
        return
    if return_to and target.id == asked_by.endpoint_id:
        return
    if may_submit(trace_submitter(parent_id), target):
        return
    if named_by_owners(asked_by, target, requested):
        owners_id = (
            Endpoint.objects.filter(id=asked_by.endpoint_id)
            .values_list("owners_id", flat=True)
            .first()
        )
        if owners_may_submit(owners_id, target):
            return
    raise Forbidden(
        "children carry their submitter's rights: neither this trace's submitter nor "
        f"(through delegate_to) this endpoint's owners may submit to {requested!r}"
    )
