"""What the runtime asks of recovery, the app above it, without importing it.

Recovery cases and their evidence belong to ``recovery``, which sits above
``runtime`` (docs/explanation/design.md, "Layers"): recovery drives the runtime (a
decision resolves an uncertain turn, a stop request reaches a worker), so
the runtime cannot import recovery back. Yet the runtime is where a turn
becomes uncertain, where late evidence about it arrives and where a worker
carries out an owner's "stop the process". Those few calls go through this
port, a typed ``Protocol`` that the recovery app provides at start-up
(``RecoveryConfig.ready``); import-linter (pyproject.toml) keeps the arrow
one way.

A registration rather than a setting naming a function: the dependency is
explicit Python, it is in place before any request or task runs, and the
type checker and a reader see each method's signature here. Without a
provider the runtime fails closed: ``quarantine_turn`` raises (its
transaction rolls back, the turn stays ``interrupting`` and the next sweep
tries again); nothing is left half-quarantined.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from tickets.models import Turn


class CaseKeeper(Protocol):
    """Recovery's side of the port (``recovery/services.py``)."""

    def open_case_for_uncertain_turn(self, *, turn: Turn, reason: str, at: datetime) -> uuid.UUID:
        """Open the case of a turn just found uncertain; runs in the caller's
        transaction (the quarantine's), so case and quarantine commit
        together. Answers the new case's id."""
        ...

    def record_late_evidence(
        self, *, turn: Turn, kind: str, seq: int, source: str, detail: dict[str, Any]
    ) -> None:
        """Late evidence about a turn, filed on its open case if it has one;
        in the caller's transaction."""
        ...

    def record_process_exit(
        self, *, stop_id: uuid.UUID | str, outcome: str, exit: dict[str, Any]
    ) -> None:
        """The worker that carried out an owner's "stop the process" reports
        the exit (late evidence on the case)."""
        ...

    def resolve_process_stop(
        self, *, stop_id: uuid.UUID | str, outcome: str, reason: str, actor: str
    ) -> bool:
        """A stop request that ends without a kill (gone, refused,
        unreachable), with the reason."""
        ...

    def resolve_stale_stops(self) -> list[uuid.UUID]:
        """The stop requests no worker can carry out any more, now closed
        (the budget sweep runs it)."""
        ...


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
