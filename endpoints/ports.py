"""What the endpoints app asks of the app above it, without importing it.

Recovery cases and their evidence belong to ``recovery``, which sits above
``endpoints`` (docs/design.md, "Layers"): the runtime never imports it. When a
turn becomes uncertain the runtime opens a case, and when late evidence about
an uncertain turn arrives it is filed on the case, through this small
interface, which the recovery app provides at start-up
(``RecoveryConfig.ready``). So the arrow between the two apps points one
way, from the case owner down to ``endpoints``; import-linter
(pyproject.toml) keeps it so.

A registration rather than a setting naming a function: the dependency is
explicit Python (the graph import-linter reads), it is in place before any
request or task runs, and there is no string to drift from the code. Without
a provider the runtime fails closed: ``quarantine_turn`` raises (its
transaction rolls back, the turn stays ``interrupting`` and the next sweep
tries again); nothing is left half-quarantined.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class CaseKeeper:
    # (turn, reason, at) -> the new case's id; runs in the caller's
    # transaction (the quarantine's), so case and quarantine commit together.
    open_case_for_uncertain_turn: Callable[..., uuid.UUID]
    # (turn, kind, seq, source, detail): late evidence about a turn, filed on
    # its open case if it has one; in the caller's transaction.
    record_late_evidence: Callable[..., None]
    # endpoint id -> the id of its open case, or None.
    open_case_id: Callable[[int], uuid.UUID | None]
    # (stop_id, outcome, exit): the worker that carried out an owner's "stop
    # the process" reports the exit (late evidence on the case).
    record_process_exit: Callable[..., None] | None = None
    # (stop_id, outcome, reason, actor): a stop request that ends without a
    # kill (gone, refused, unreachable), with the reason.
    resolve_process_stop: Callable[..., bool] | None = None
    # () -> the stop requests no worker can carry out any more, now closed
    # (the budget sweep runs it).
    resolve_stale_stops: Callable[[], list[uuid.UUID]] | None = None


_keeper: CaseKeeper | None = None


def provide_case_keeper(keeper: CaseKeeper) -> None:
    global _keeper
    _keeper = keeper


def case_keeper() -> CaseKeeper:
    if _keeper is None:
        raise ImproperlyConfigured(
            "no case keeper: the app that owns cases must provide one in its AppConfig.ready()"
        )
    return _keeper


def open_case_id(endpoint_id: int) -> uuid.UUID | None:
    """The id of the endpoint's open recovery case, or None."""
    return case_keeper().open_case_id(endpoint_id)
