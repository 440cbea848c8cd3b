"""Callbacks: finished work returns to the endpoint that asked for it.

``ensure_callback`` is idempotent and converges: the callback ticket's dedupe
key is derived from the source id and ``Callback.source`` is unique, so
repeated or concurrent completion notices find the same callback.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.utils import timezone

from core.errors import DomainError

from .events import append_event, update_fields
from .models import TERMINAL_STATES, Callback, CallbackState, Ticket, TicketEvent

log = logging.getLogger(__name__)


def callback_key(source_id: uuid.UUID) -> str:
    return f"callback:{source_id}"


def original_of(ticket: Ticket) -> uuid.UUID:
    """The first ticket of a re-run chain (itself when it is no re-run): the
    child its parent knows. Its callback key is the one every re-run of it
    answers under, so a late callback converges with the re-run's."""
    original = ticket.id
    rerun_of = ticket.rerun_of_id
    while rerun_of is not None:  # a chain is as long as the owners' re-runs
        original = rerun_of
        rerun_of = Ticket.objects.filter(id=rerun_of).values_list("rerun_of_id", flat=True).get()
    return original


def ensure_callback(*, source_id: uuid.UUID) -> Callback | None:
    """Admit the one callback ticket for a terminal ``source`` with
    ``return_to``: trace, completed ticket id, response, requester metadata
    and continuation. The source's callback state goes ``pending ->
    accepted``. The one home of "owes a callback" (terminal, ``return_to``,
    still ``pending``), checked here under the source's row lock: a move
    of a ticket that reports calls it (tickets/terminal.py ``after_move``),
    and so does the obligations sweep. A target that refuses (quarantined,
    circuit open) leaves it ``pending`` with an event; the sweep tries
    again."""
    from .admission import admit_ticket

    # No savepoint inside a caller's transaction (a turn's finish): nothing
    # here catches a database error to go on, so a failure rolls the whole
    # transaction back either way, and a savepoint would only add round trips.
    with transaction.atomic(savepoint=False):
        # of=("self",): lock only the ticket row. return_to is a nullable
        # foreign key, so the join is an outer one, and PostgreSQL refuses
        # FOR UPDATE on the nullable side of an outer join.
        source = (
            Ticket.objects.select_for_update(of=("self",))
            .select_related("return_to")
            .get(id=source_id)
        )
        if source.return_to_id is None or source.state not in TERMINAL_STATES:
            return None
        existing = Callback.objects.filter(source=source).first()
        if existing is not None:
            return existing
        if source.callback_state != CallbackState.PENDING:
            # Nothing owed: an orphan superseded by a re-run passed its
            # callback to the re-run (claimcheck_ticket_move).
            return None
        original = original_of(source)
        payload = {
            "callback": {
                # The child the parent dispatched; a re-run answers for it.
                "source": str(original),
                **({"answered_by": str(source.id)} if original != source.id else {}),
                "state": source.state,
                "result": source.result,
                "error": source.error,
                "artifacts": source.artifacts,
                "continuation": source.continuation,
                "trace_id": source.trace_id,
                "requester": source.requester,
            }
        }
        try:
            # One statement (claimcheck_admit): a refusal is its answer, not
            # a database error, and it wrote nothing: no savepoint to undo.
            admitted = admit_ticket(
                endpoint=source.return_to.address,
                input=payload,
                dedupe_key=callback_key(original),
                parent_id=source.id,
                callback_for_id=source.id,
                requester=source.requester,
                actor="callbacks",
            )
        except DomainError as exc:
            _record_refusal(source_id=source.id, exc=exc)
            return None
        callback = Callback.objects.create(
            source=source,
            target_id=source.return_to_id,
            ticket=admitted.ticket,
            created_at=timezone.now(),
        )
        update_fields(
            ticket_id=source.id,
            kind="callback_accepted",
            actor="callbacks",
            detail={"callback": str(admitted.ticket.id)},
            callback_state=CallbackState.ACCEPTED,
        )
    return callback


def _record_refusal(*, source_id: uuid.UUID, exc: DomainError) -> None:
    """An event for the first refusal and for each change of reason; the
    obligations sweep retries every round, and a target quarantined for a
    day must not write thousands of identical events."""
    last = (
        TicketEvent.objects.filter(ticket_id=source_id)
        .order_by("-id")
        .values_list("kind", "detail")
        .first()
    )
    if last is not None and last[0] == "callback_refused" and last[1].get("error") == exc.code:
        log.info("callback for %s still refused: %s", source_id, exc.detail)
        return
    append_event(
        ticket_id=source_id,
        kind="callback_refused",
        actor="callbacks",
        detail={"error": exc.code, "detail": exc.detail},
    )
    log.warning("callback for %s refused: %s", source_id, exc.detail)


def pending_callbacks(limit: int = 100):
    """Ids of terminal tickets whose callback a target refused earlier
    (quarantined, circuit open), oldest first (``ticket_callback_pending_idx``
    holds only those: the query costs the same on any ledger)."""
    return (
        Ticket.objects.filter(callback_state=CallbackState.PENDING, state__in=TERMINAL_STATES)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )


def retry_pending_callbacks(limit: int = 100) -> int:
    """Admit the callbacks ``pending_callbacks`` names; returns how many were
    admitted now."""
    done = 0
    for source_id in pending_callbacks(limit):
        if ensure_callback(source_id=source_id) is not None:
            done += 1
    return done
