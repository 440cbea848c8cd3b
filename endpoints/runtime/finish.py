"""Finishing the exact turn: its outcome applied (result, failure, wait
for children, a callback's resume), the context entry, the callback record
and the lock released -- or refused as stale evidence."""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone

from config import observe
from config.canonical import canonical_json
from config.dispatch import DELIVER, publish
from config.errors import DomainError, StaleTurn
from tickets import lifecycle
from tickets.ids import new_id
from tickets.models import CallbackState, Ticket, TicketState

from .. import runners
from ..models import (
    TURN_ACTIVE_STATES,
    ContextEntry,
    EndpointLock,
    Turn,
    TurnState,
)
from ..runners import Outcome
from . import fastpath
from .dispatch import publish_next, redispatch_if_free, release_lock
from .evidence import record_stale

log = logging.getLogger(__name__)


def _externalize(outcome: Outcome, turn_id: uuid.UUID) -> Outcome:
    """A result over the cap becomes an artifact; the ticket keeps the pointer."""
    if outcome.kind != "success" or outcome.result is None:
        return outcome
    body = canonical_json(outcome.result)
    if len(body) <= settings.TICKET_MAX_RESULT_BYTES:
        return outcome
    sha = hashlib.sha256(body).hexdigest()
    # Content-addressed: a finish retried after a database blip (or an agent
    # posting the same result again) reuses the file instead of a copy.
    name = f"results/{sha[:2]}/{sha}.json"
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(body))
    pointer = {
        "uri": f"artifact://{name}",
        "sha256": sha,
        "bytes": len(body),
        "media_type": "application/json",
        "role": "result",
    }
    log.info("turn %s result of %s bytes stored as %s", turn_id, len(body), name)
    return Outcome(
        "success",
        result={"artifact": pointer["uri"], "bytes": len(body), "sha256": sha},
        artifacts=[*outcome.artifacts, pointer],
        resume=outcome.resume,
    )


def outcome_digest(outcome: Outcome) -> str:
    """A fingerprint of an outcome as the runner gave it (before a large
    result becomes an artifact). The terminal event of a turn carries it as
    ``outcome_sha256``: a repeat of the same finish recognises its own
    committed work by it (``finish_turn``, step 2)."""
    return hashlib.sha256(canonical_json(asdict(outcome), default=str)).hexdigest()


@dataclass
class Finished:
    accepted: bool
    ticket_state: str | None = None
    reason: str = ""
    duplicate: bool = False  # this outcome was already recorded by an earlier attempt
    slot_recorded: bool = False  # the finish statement marked the worker's slot idle
    # With ``hand_on``: the endpoint's next ticket, unmarked and not published,
    # for the caller to start itself or publish (``dispatch.publish_next``).
    next_ticket: uuid.UUID | None = None


def finish_turn(
    *,
    turn_id: uuid.UUID,
    seq: int,
    outcome: Outcome,
    source: str,
    strict: bool = False,
    turn: Turn | None = None,
    slot: tuple[str, int] | None = None,
    hand_on: bool = False,
) -> Finished:
    """Accept a turn's outcome only from the exact turn (DESIGN.md flow 2).

    1. Lock ticket, lock row, turn (in that order).
    2. Exact means: ticket.turn, lock.holder and the turn are the same, the
       lock token, the turn's seq and the given seq are equal, and the turn is
       still active. A turn that already ended with this very outcome (the
       same ``outcome_sha256`` on its terminal event: an earlier attempt
       committed and lost its reply in a database blip) is a duplicate:
       nothing is written again and the caller gets the recorded state.
       Anything else is recorded as evidence (a ticket event, and on the
       recovery case when the turn is uncertain) and changes nothing; with
       ``strict`` the caller gets ``StaleTurn``.
    3. An interrupted turn, or stop evidence, ends as ``stopped``: the ticket
       fails as timed out (or is cancelled, when a cancel asked for it).
    4. Otherwise apply the outcome: success / failure / wait for children,
       and a callback turn's resume of the ticket it reports to.
    5. Append the context entry, release the lock, and after commit dispatch
       the endpoint's oldest queued ticket.

    On PostgreSQL the common case (a root ticket's turn, still running, that
    succeeded or failed) is one statement with all of step 2's guards
    (``fastpath.finish``); when any guard does not hold it writes nothing
    and the general path below decides. With ``hand_on`` the statement's
    next ticket is not published but handed back (``Finished.next_ticket``):
    the worker that asked starts it itself, or publishes it.
    """
    digest = outcome_digest(outcome)
    outcome = _externalize(outcome, turn_id)
    # Which ticket and endpoint to lock (immutable columns): from the caller's
    # copy of the turn when it has one, else one read.
    if turn is None or turn.id != turn_id:
        turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    if fastpath.enabled():
        fast = _finish_fast(
            turn=turn,
            seq=seq,
            outcome=outcome,
            source=source,
            digest=digest,
            slot=slot,
            hand_on=hand_on,
        )
        if fast is not None:
            state, handed = fast
            log.info("turn %s seq %s finished: ticket %s %s", turn.id, seq, turn.ticket_id, state)
            return Finished(
                accepted=True,
                ticket_state=state,
                slot_recorded=slot is not None,
                next_ticket=handed,
            )
    stale_reason = ""
    duplicate = False
    with transaction.atomic():
        ticket = Ticket.objects.select_for_update().get(id=turn.ticket_id)
        lock = EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
        turn = (
            Turn.objects.select_for_update(of=("self",)).select_related("endpoint").get(id=turn_id)
        )
        exact = (
            ticket.turn_id == turn.id
            and lock.holder_id == turn.id
            and lock.token == turn.seq == seq
            and turn.state in TURN_ACTIVE_STATES
        )
        if exact:
            state = _apply(ticket=ticket, turn=turn, outcome=outcome, source=source, digest=digest)
            release_lock(endpoint_id=turn.endpoint_id, turn=turn)
        elif _already_finished(turn=turn, seq=seq, digest=digest):
            duplicate, state = True, ticket.state
            redispatch_if_free(lock)
        else:
            stale_reason = (
                f"turn {turn.id} is {turn.state}; seq {seq} vs current {lock.token}"
                if turn.state not in TURN_ACTIVE_STATES or lock.token != seq
                else f"turn {turn.id} is not the exact turn of ticket {ticket.id}"
            )
            record_stale(
                turn=turn,
                seq=seq,
                kind=outcome.kind,
                source=source,
                detail=_evidence_detail(outcome),
            )
    if stale_reason:
        log.warning("stale outcome for turn %s refused: %s", turn_id, stale_reason)
        if strict:
            raise StaleTurn(stale_reason, state=turn.state)
        return Finished(accepted=False, reason=stale_reason)
    if duplicate:
        log.warning(
            "turn %s seq %s had already finished with this outcome (an earlier attempt "
            "committed): nothing recorded again; ticket %s is %s",
            turn.id,
            seq,
            ticket.id,
            state,
        )
        return Finished(accepted=True, ticket_state=state, duplicate=True)
    log.info("turn %s seq %s finished: ticket %s %s", turn.id, turn.seq, ticket.id, state)
    return Finished(accepted=True, ticket_state=state)


def _finish_fast(
    *,
    turn: Turn,
    seq: int,
    outcome: Outcome,
    source: str,
    digest: str,
    slot: tuple[str, int] | None,
    hand_on: bool = False,
) -> tuple[str, uuid.UUID | None] | None:
    """The one-statement finish of a root ticket's turn that succeeded or
    failed; the ticket's new state and the next ticket handed on (with
    ``hand_on``; else it is published), or None when the statement's guards
    did not all hold (nothing written: the general path decides)."""
    if outcome.kind not in ("success", "failure") or outcome.resume is not None:
        return None
    success = outcome.kind == "success"
    now = timezone.now()
    done = fastpath.finish(
        ticket_id=turn.ticket_id,
        endpoint_id=turn.endpoint_id,
        turn_id=turn.id,
        seq=seq,
        success=success,
        result=outcome.result,
        artifacts=outcome.artifacts,
        error=outcome.error,
        actor=f"turn:{seq}:{source}",
        detail={"outcome_sha256": digest},
        delivery_id=new_id(),
        now=now,
        slot=slot,
    )
    if done is None:
        return None
    next_ticket, delivery_id, due = done
    to = TicketState.SUCCEEDED if success else TicketState.FAILED
    # After commit (in autocommit the statement has committed): the metrics,
    # the next ticket's message and a due webhook delivery.
    observe.transition(
        ticket_id=turn.ticket_id,
        expected=TicketState.RUNNING,
        to=to,
        kind="turn_completed" if success else "turn_failed",
        turn_id=turn.id,
        fields={},
    )
    if next_ticket is not None and not hand_on:
        publish_next(next_ticket)
    if due:
        publish(DELIVER, str(delivery_id))
    return to, (next_ticket if hand_on else None)


def _already_finished(*, turn: Turn, seq: int, digest: str) -> bool:
    """Did this turn already end with this outcome? Its terminal event (one
    per turn, written in the finishing transaction) carries the digest; the
    turn row is locked by the caller. Only read on the rare refused path."""
    from tickets.models import TicketEvent

    return (
        turn.seq == seq
        and turn.state not in TURN_ACTIVE_STATES
        and TicketEvent.objects.filter(
            ticket_id=turn.ticket_id, turn_id=turn.id, detail__outcome_sha256=digest
        ).exists()
    )


def _evidence_detail(outcome: Outcome) -> dict[str, Any]:
    detail: dict[str, Any] = {"outcome": outcome.kind}
    if outcome.evidence:
        detail["evidence"] = outcome.evidence
    if outcome.result is not None:
        body = canonical_json(outcome.result)
        detail["result_sha256"] = hashlib.sha256(body).hexdigest()
        if len(body) <= settings.TICKET_MAX_RESULT_BYTES:
            detail["result"] = outcome.result
    if outcome.error is not None:
        detail["error"] = outcome.error
    return detail


def _end_turn(turn: Turn, state: str, *, evidence: dict[str, Any] | None = None) -> None:
    now = timezone.now()
    fields: dict[str, Any] = {"state": state, "ended_at": now}
    if evidence is not None:
        fields["stop_evidence"] = {**evidence, "observed_at": now.isoformat(), "seq": turn.seq}
    updated = Turn.objects.filter(id=turn.id, state__in=TURN_ACTIVE_STATES).update(**fields)
    if updated != 1:
        # The turn row is locked by the caller, who checked it is active: a miss is a bug.
        raise RuntimeError(f"turn {turn.id} is no longer active; cannot end it as {state}")


def _apply(*, ticket: Ticket, turn: Turn, outcome: Outcome, source: str, digest: str) -> str:
    actor = f"turn:{turn.seq}:{source}"
    # On the turn's terminal event: how a repeated finish knows its own work.
    mark = {"outcome_sha256": digest}
    if turn.state == TurnState.INTERRUPTING or outcome.kind == "stopped":
        evidence = outcome.evidence or {
            "kind": "runner_returned",
            "detail": {"returned": outcome.kind, "after_interrupt": True},
        }
        _end_turn(turn, TurnState.STOPPED, evidence=evidence)
        if ticket.cancel_requested_at is not None:
            to, error = TicketState.CANCELLED, {"code": "cancelled", "detail": "cancelled"}
        else:
            reason = turn.interrupt_reason or "stopped"
            code = {
                "deadline": "timed_out",
                "heartbeat": "heartbeat_lost",
                "shutdown": "interrupted",
            }.get(reason, reason)
            to = TicketState.FAILED
            signals = (evidence.get("detail") or {}).get("signals_sent") or []
            how = f" by {', '.join(signals)}" if signals else ""
            error = {
                "code": code,
                "detail": f"turn {turn.seq} was interrupted ({reason}) and stopped{how}",
                "budget_s": turn.endpoint.turn_budget_s,
            }
            if signals:
                error["signals"] = signals
        lifecycle.transition(
            ticket_id=ticket.id,
            expected=TicketState.RUNNING,
            to=to,
            kind="turn_stopped",
            actor=actor,
            turn_id=turn.id,
            detail={"evidence": evidence, **mark},
            error=error,
        )
        return to

    if outcome.kind == "wait":
        return _apply_wait(ticket=ticket, turn=turn, outcome=outcome, actor=actor, mark=mark)

    if outcome.kind == "success":
        return _conclude(
            ticket=ticket,
            turn=turn,
            actor=actor,
            turn_state=TurnState.COMPLETED,
            to=TicketState.SUCCEEDED,
            kind="turn_completed",
            detail=mark,
            context=outcome.result,
            artifacts=outcome.artifacts,
            resume=outcome.resume,
            result=outcome.result,
        )

    # failure (or anything unexpected, which is a failure too)
    error = (
        outcome.error
        if outcome.kind == "failure"
        else {"code": "bad_outcome", "detail": f"runner outcome {outcome.kind!r}"}
    )
    return _fail_turn(ticket=ticket, turn=turn, actor=actor, error=error, mark=mark)


def _fail_turn(*, ticket: Ticket, turn: Turn, actor: str, error: Any, mark: dict[str, str]) -> str:
    return _conclude(
        ticket=ticket,
        turn=turn,
        actor=actor,
        turn_state=TurnState.FAILED,
        to=TicketState.FAILED,
        kind="turn_failed",
        detail=mark,
        context={"error": error},
        error=error,
    )


def _conclude(
    *,
    ticket: Ticket,
    turn: Turn,
    actor: str,
    turn_state: str,
    to: str,
    kind: str,
    detail: dict[str, Any],
    context: Any,
    artifacts: list | None = None,
    resume: runners.Resume | None = None,
    record_callback: bool = True,
    **ticket_fields: Any,
) -> str:
    """The end of a turn that ran to an outcome (success, failure, wait), in
    one order: the turn ends, its context entry is appended, a callback's
    resume is applied, the ticket moves ``running -> to`` with its terminal
    event, and a callback ticket's source shows ``recorded``."""
    _end_turn(turn, turn_state)
    _context_entry(ticket, turn, context, artifacts or [])
    if resume is not None:
        _apply_resume(ticket=ticket, turn=turn, resume=resume, actor=actor)
    fields = {"artifacts": artifacts} if artifacts is not None else {}
    lifecycle.transition(
        ticket_id=ticket.id,
        expected=TicketState.RUNNING,
        to=to,
        kind=kind,
        actor=actor,
        turn_id=turn.id,
        detail=detail,
        **fields,
        **ticket_fields,
    )
    if record_callback:
        _record_callback(ticket, actor)
    return to


def _context_entry(ticket: Ticket, turn: Turn, result: Any, artifacts: list) -> None:
    ContextEntry.objects.create(
        endpoint_id=turn.endpoint_id,
        turn=turn,
        ticket=ticket,
        seq=turn.seq,
        input=ticket.input,
        result=result,
        artifacts=artifacts,
    )


def _apply_wait(
    *, ticket: Ticket, turn: Turn, outcome: Outcome, actor: str, mark: dict[str, str]
) -> str:
    """Admit the children (in this transaction: no orphan children if the
    outcome is refused) and move the ticket to ``waiting``; the lock is
    released by the caller. A child that cannot be admitted fails the ticket."""
    from tickets.admission import admit_ticket

    wait = outcome.wait
    children: list[str] = []
    try:
        with transaction.atomic():
            for i, child in enumerate(wait.children):
                admitted = admit_ticket(
                    endpoint=child.endpoint,
                    input=child.input,
                    dedupe_key=child.dedupe_key or f"{ticket.id}/child/{i}",
                    parent_id=ticket.id,
                    return_to=turn.endpoint.address,
                    continuation=wait.continuation,
                    actor=actor,
                )
                children.append(str(admitted.ticket.id))
    except DomainError as exc:
        error = {"code": exc.code, "detail": f"cannot dispatch children: {exc.detail}"}
        return _fail_turn(ticket=ticket, turn=turn, actor=actor, error=error, mark=mark)
    return _conclude(
        ticket=ticket,
        turn=turn,
        actor=actor,
        turn_state=TurnState.COMPLETED,
        to=TicketState.WAITING,
        kind="waiting_for_children",
        detail={"children": children, "continuation": wait.continuation, **mark},
        context={"waiting_for": children},
        # A waiting ticket is not done: its callback is recorded when it is.
        record_callback=False,
    )


def _apply_resume(*, ticket: Ticket, turn: Turn, resume: runners.Resume, actor: str) -> None:
    """A callback's turn completes (or keeps waiting) the ticket it reports
    to. Only a waiting ticket of this same endpoint can be resumed; anything
    else is recorded and ignored (a repeated callback after completion)."""
    try:
        target_id = uuid.UUID(str(resume.ticket))
    except ValueError:
        target_id = None
    target = Ticket.objects.select_for_update().filter(id=target_id).first() if target_id else None
    if target is None or target.endpoint_id != turn.endpoint_id:
        lifecycle.append_event(
            ticket_id=ticket.id,
            kind="resume_refused",
            actor=actor,
            turn_id=turn.id,
            detail={"target": str(resume.ticket), "why": "not a ticket of this endpoint"},
        )
        return
    if target.state != TicketState.WAITING:
        lifecycle.append_event(
            ticket_id=ticket.id,
            kind="resume_ignored",
            actor=actor,
            turn_id=turn.id,
            detail={"target": str(target.id), "target_state": target.state},
        )
        return
    if resume.keep_waiting:
        lifecycle.append_event(
            ticket_id=target.id,
            kind="still_waiting",
            actor=actor,
            turn_id=turn.id,
            detail={"callback": str(ticket.id)},
        )
        return
    if resume.error is not None:
        lifecycle.transition(
            ticket_id=target.id,
            expected=TicketState.WAITING,
            to=TicketState.FAILED,
            kind="resumed",
            actor=actor,
            turn_id=turn.id,
            completed_by_turn=turn,
            error=resume.error if isinstance(resume.error, dict) else {"detail": resume.error},
            detail={"callback": str(ticket.id)},
        )
    else:
        lifecycle.transition(
            ticket_id=target.id,
            expected=TicketState.WAITING,
            to=TicketState.SUCCEEDED,
            kind="resumed",
            actor=actor,
            turn_id=turn.id,
            completed_by_turn=turn,
            result=resume.result,
            detail={"callback": str(ticket.id)},
        )


def _record_callback(ticket: Ticket, actor: str) -> None:
    """A callback ticket's own turn finished: its source shows ``recorded``."""
    if ticket.callback_for_id is None:
        return
    accepted = Ticket.objects.filter(
        id=ticket.callback_for_id, callback_state=CallbackState.ACCEPTED
    ).exists()
    if accepted:
        lifecycle.update_fields(
            ticket_id=ticket.callback_for_id,
            kind="callback_recorded",
            actor=actor,
            detail={"callback": str(ticket.id)},
            callback_state=CallbackState.RECORDED,
        )
