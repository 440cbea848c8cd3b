"""The turn runtime: start, heartbeat, finish and interrupt exact turns; the
sweeps that enforce budgets and re-dispatch lost work; quarantine.

Lock order, everywhere, to rule out deadlocks:
``EndpointLock`` before a queued ticket in ``start_turn``; otherwise
``Ticket -> EndpointLock -> Turn -> Endpoint``. No I/O while a lock is held:
runners, agent cancels and broker publishes happen outside transactions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from config.dispatch import RUN_TICKET, publish
from config.errors import DomainError, StaleTurn
from tickets import lifecycle
from tickets.models import CallbackState, Ticket, TicketState

from . import runners
from .models import (
    TURN_ACTIVE_STATES,
    ContextEntry,
    Endpoint,
    EndpointLock,
    EndpointState,
    RunnerKind,
    Turn,
    TurnState,
)
from .runners import Outcome, TurnContext

log = logging.getLogger(__name__)

HISTORY_ENTRIES = 20


def _worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


# --- Start --------------------------------------------------------------------------------


@dataclass
class Started:
    turn: Turn
    ticket: Ticket
    endpoint: Endpoint


def start_turn(*, ticket_id: uuid.UUID, celery_task_id: str = "") -> Started | None:
    """Start the next turn of the endpoint a dispatch message names
    (DESIGN.md flow 2). Returns None when there is nothing to do.

    1. A ticket no longer ``queued`` means a duplicate message: do nothing.
    2. Lock the endpoint's lock row. Held, or endpoint quarantined: leave the
       ticket queued, marked ``needs_dispatch`` (the release publishes it; a
       quarantined endpoint dispatches nothing).
    3. Take the endpoint's *oldest* queued ticket (FIFO per endpoint), skipping
       rows another transaction holds (a cancel in flight). If that is not the
       message's ticket, the message's ticket needs a dispatch now.
    4. ``seq = ++turn_seq``; create the Turn; make it the lock holder and the
       ticket's registered turn; ticket ``queued -> running``; events.
    """
    endpoint_id = (
        Ticket.objects.filter(id=ticket_id, state=TicketState.QUEUED)
        .values_list("endpoint_id", flat=True)
        .first()
    )
    if endpoint_id is None:
        return None  # unknown or no longer queued: a duplicate message
    with transaction.atomic():
        lock = (
            EndpointLock.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .get(endpoint_id=endpoint_id)
        )
        if lock.holder_id is not None:
            _needs_dispatch(ticket_id)
            return None
        # Read the clock only once the lock is ours: the turn's interval then
        # lies inside the lock's tenure.
        now = timezone.now()
        ticket = (
            Ticket.objects.select_for_update(skip_locked=True)
            .filter(endpoint_id=endpoint_id, state=TicketState.QUEUED)
            .order_by("id")
            .first()
        )
        if ticket is None:
            return None
        # The fencing token: strictly increasing per endpoint. turn_seq only
        # moves here, under the lock row we hold, so the value we read is the
        # current one; the UPDATE still checks it, and that the endpoint is
        # available (quarantine fails closed).
        endpoint = lock.endpoint
        seq = endpoint.turn_seq + 1
        bumped = Endpoint.objects.filter(
            id=endpoint_id, state=EndpointState.AVAILABLE, turn_seq=seq - 1
        ).update(turn_seq=seq)
        if not bumped:
            _needs_dispatch(ticket_id)
            return None
        endpoint.turn_seq = seq
        if ticket.id != ticket_id:
            _needs_dispatch(ticket_id)
        turn = Turn.objects.create(
            endpoint=endpoint,
            ticket=ticket,
            seq=seq,
            state=TurnState.RUNNING,
            runner_kind=endpoint.runner.get("kind", ""),
            celery_task_id=celery_task_id or "",
            worker=_worker_identity(),
            started_at=now,
            heartbeat_at=now,
            deadline_at=now + timedelta(seconds=endpoint.turn_budget_s),
        )
        EndpointLock.objects.filter(endpoint_id=endpoint_id, holder__isnull=True).update(
            holder=turn, token=turn.seq, acquired_at=now
        )
        lifecycle.transition(
            ticket_id=ticket.id,
            expected=TicketState.QUEUED,
            to=TicketState.RUNNING,
            kind="turn_started",
            actor=f"worker:{turn.worker['host']}:{turn.worker['pid']}",
            turn_id=turn.id,
            detail={"seq": turn.seq, "deadline_at": turn.deadline_at.isoformat()},
            turn=turn,
        )
    ticket.state, ticket.turn = TicketState.RUNNING, turn  # as written above
    return Started(turn=turn, ticket=ticket, endpoint=endpoint)


# --- Heartbeat ------------------------------------------------------------------------------


@dataclass
class HeartbeatState:
    current: bool
    interrupted: bool


def heartbeat(
    *, turn_id: uuid.UUID, seq: int, source: str = "worker", strict: bool = False
) -> HeartbeatState:
    """Record liveness of an active exact turn. A heartbeat for a turn that is
    not active (ended, uncertain) or with another ``seq`` changes nothing: it
    is evidence only, and with ``strict`` raises ``StaleTurn``."""
    now = timezone.now()
    updated = Turn.objects.filter(id=turn_id, seq=seq, state__in=TURN_ACTIVE_STATES).update(
        heartbeat_at=now
    )
    state = Turn.objects.filter(id=turn_id).values_list("state", flat=True).first()
    if updated:
        return HeartbeatState(current=True, interrupted=state == TurnState.INTERRUPTING)
    if strict:
        with transaction.atomic():
            turn = Turn.objects.filter(id=turn_id).first()
            if turn is not None:
                _record_stale(turn=turn, seq=seq, kind="heartbeat", source=source, detail={})
        raise StaleTurn(
            f"turn {turn_id} with seq {seq} is not the current exact turn (state {state})",
            state=state,
        )
    return HeartbeatState(current=False, interrupted=True)


class _Heartbeater(threading.Thread):
    """Heartbeats for a turn running in this worker, and raises the runner's
    interrupt flag when the turn is asked to stop (cooperative interrupt)."""

    def __init__(self, turn: Turn, interval: float, interrupt: threading.Event) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{turn.id}")
        self.turn, self.interval, self.interrupt = turn, interval, interrupt
        self.done = threading.Event()

    def beat(self) -> bool:
        state = heartbeat(turn_id=self.turn.id, seq=self.turn.seq)
        if state.interrupted:
            self.interrupt.set()
        return state.interrupted

    def run(self) -> None:
        try:
            while not self.done.wait(self.interval):
                try:
                    self.beat()
                except Exception:  # a database blip must not kill the turn
                    log.exception("heartbeat for turn %s failed", self.turn.id)
                    close_old_connections()
        finally:
            connection.close()


# --- Run --------------------------------------------------------------------------------------


def run_ticket(*, ticket_id: uuid.UUID, celery_task_id: str = "") -> uuid.UUID | None:
    """What the worker does with a dispatch message: start the turn, run the
    runner outside any transaction while heartbeating, finish the turn."""
    started = start_turn(ticket_id=ticket_id, celery_task_id=celery_task_id)
    if started is None:
        return None
    turn, ticket, endpoint = started.turn, started.ticket, started.endpoint
    interrupt = threading.Event()
    beater = _Heartbeater(turn, runners.heartbeat_interval(endpoint.heartbeat_timeout_s), interrupt)
    ctx = TurnContext(
        ticket_id=ticket.id,
        turn_id=turn.id,
        seq=turn.seq,
        endpoint=endpoint.address,
        input=ticket.input,
        history=_history(endpoint.id),
        deadline=turn.deadline_at,
        runner=endpoint.runner,
        interrupt_grace_s=endpoint.interrupt_grace_s,
        _interrupt=interrupt,
        _heartbeat=beater.beat,
        _children_of=lambda parent: _children_of(endpoint.id, parent),
    )
    log.info(
        "turn %s seq %s started for ticket %s on %s", turn.id, turn.seq, ticket.id, endpoint.address
    )
    beater.start()
    try:
        outcome = runners.run(ctx)
    finally:
        beater.done.set()
        beater.join(timeout=5)
    if outcome.kind == "deferred":
        log.info("turn %s deferred: the agent answers through the API", turn.id)
        return turn.id
    finish_turn(turn_id=turn.id, seq=turn.seq, outcome=outcome, source="worker", turn=turn)
    return turn.id


def _history(endpoint_id: int) -> list[dict[str, Any]]:
    rows = ContextEntry.objects.filter(endpoint_id=endpoint_id).order_by("-seq")[:HISTORY_ENTRIES]
    return [
        {"seq": e.seq, "ticket": str(e.ticket_id), "input": e.input, "result": e.result}
        for e in reversed(rows)
    ]


def _children_of(endpoint_id: int, parent_id: str) -> list[dict[str, Any]]:
    try:
        parent_uuid = uuid.UUID(str(parent_id))
    except ValueError:
        return []
    # Only this endpoint's own tickets: a runner reads its own work, nobody else's.
    rows = Ticket.objects.filter(parent_id=parent_uuid, parent__endpoint_id=endpoint_id)
    return [
        {"id": str(t.id), "state": t.state, "result": t.result, "error": t.error}
        for t in rows.order_by("id")
        if t.callback_for_id is None
    ]


# --- Finish ---------------------------------------------------------------------------------


def _externalize(outcome: Outcome, turn_id: uuid.UUID) -> Outcome:
    """A result over the cap becomes an artifact; the ticket keeps the pointer."""
    if outcome.kind != "success" or outcome.result is None:
        return outcome
    body = json.dumps(outcome.result, sort_keys=True, separators=(",", ":")).encode()
    if len(body) <= settings.TICKET_MAX_RESULT_BYTES:
        return outcome
    sha = hashlib.sha256(body).hexdigest()
    name = default_storage.save(f"results/{sha[:2]}/{sha}.json", ContentFile(body))
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


@dataclass
class Finished:
    accepted: bool
    ticket_state: str | None = None
    reason: str = ""


def finish_turn(
    *,
    turn_id: uuid.UUID,
    seq: int,
    outcome: Outcome,
    source: str,
    strict: bool = False,
    turn: Turn | None = None,
) -> Finished:
    """Accept a turn's outcome only from the exact turn (DESIGN.md flow 2).

    1. Lock ticket, lock row, turn (in that order).
    2. Exact means: ticket.turn, lock.holder and the turn are the same, the
       lock token, the turn's seq and the given seq are equal, and the turn is
       still active. Anything else is recorded as evidence (a ticket event,
       and on the recovery case when the turn is uncertain) and changes
       nothing; with ``strict`` the caller gets ``StaleTurn``.
    3. An interrupted turn, or stop evidence, ends as ``stopped``: the ticket
       fails as timed out (or is cancelled, when a cancel asked for it).
    4. Otherwise apply the outcome: success / failure / wait for children,
       and a callback turn's resume of the ticket it reports to.
    5. Append the context entry, release the lock, and after commit dispatch
       the endpoint's oldest queued ticket.
    """
    outcome = _externalize(outcome, turn_id)
    # Which ticket and endpoint to lock (immutable columns): from the caller's
    # copy of the turn when it has one, else one read.
    if turn is None or turn.id != turn_id:
        turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    stale_reason = ""
    with transaction.atomic():
        ticket = Ticket.objects.select_for_update().get(id=turn.ticket_id)
        lock = EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
        turn = (
            Turn.objects.select_for_update(of=("self",)).select_related("endpoint").get(id=turn_id)
        )
        if not (
            ticket.turn_id == turn.id
            and lock.holder_id == turn.id
            and lock.token == turn.seq == seq
            and turn.state in TURN_ACTIVE_STATES
        ):
            stale_reason = (
                f"turn {turn.id} is {turn.state}; seq {seq} vs current {lock.token}"
                if turn.state not in TURN_ACTIVE_STATES or lock.token != seq
                else f"turn {turn.id} is not the exact turn of ticket {ticket.id}"
            )
            _record_stale(
                turn=turn,
                seq=seq,
                kind=outcome.kind,
                source=source,
                detail=_evidence_detail(outcome),
            )
        else:
            state = _apply(ticket=ticket, turn=turn, outcome=outcome, source=source)
            release_lock(endpoint_id=turn.endpoint_id, turn=turn)
    if stale_reason:
        log.warning("stale outcome for turn %s refused: %s", turn_id, stale_reason)
        if strict:
            raise StaleTurn(stale_reason, state=turn.state)
        return Finished(accepted=False, reason=stale_reason)
    log.info("turn %s seq %s finished: ticket %s %s", turn.id, turn.seq, ticket.id, state)
    return Finished(accepted=True, ticket_state=state)


def _evidence_detail(outcome: Outcome) -> dict[str, Any]:
    detail: dict[str, Any] = {"outcome": outcome.kind}
    if outcome.evidence:
        detail["evidence"] = outcome.evidence
    if outcome.result is not None:
        body = json.dumps(outcome.result, sort_keys=True).encode()
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
    assert updated == 1  # the turn row is locked by the caller


def _apply(*, ticket: Ticket, turn: Turn, outcome: Outcome, source: str) -> str:
    actor = f"turn:{turn.seq}:{source}"
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
            code = {"deadline": "timed_out", "heartbeat": "heartbeat_lost"}.get(reason, reason)
            to = TicketState.FAILED
            error = {
                "code": code,
                "detail": f"turn {turn.seq} was interrupted ({reason}) and stopped",
                "budget_s": turn.endpoint.turn_budget_s,
            }
        lifecycle.transition(
            ticket_id=ticket.id,
            expected=TicketState.RUNNING,
            to=to,
            kind="turn_stopped",
            actor=actor,
            turn_id=turn.id,
            detail={"evidence": evidence},
            error=error,
        )
        return to

    if outcome.kind == "wait":
        return _apply_wait(ticket=ticket, turn=turn, outcome=outcome, actor=actor)

    if outcome.kind == "success":
        _end_turn(turn, TurnState.COMPLETED)
        _context_entry(ticket, turn, outcome.result, outcome.artifacts)
        if outcome.resume is not None:
            _apply_resume(ticket=ticket, turn=turn, resume=outcome.resume, actor=actor)
        lifecycle.transition(
            ticket_id=ticket.id,
            expected=TicketState.RUNNING,
            to=TicketState.SUCCEEDED,
            kind="turn_completed",
            actor=actor,
            turn_id=turn.id,
            result=outcome.result,
            artifacts=outcome.artifacts,
        )
        _record_callback(ticket, actor)
        return TicketState.SUCCEEDED

    # failure (or anything unexpected, which is a failure too)
    error = (
        outcome.error
        if outcome.kind == "failure"
        else {"code": "bad_outcome", "detail": f"runner outcome {outcome.kind!r}"}
    )
    return _fail_turn(ticket=ticket, turn=turn, actor=actor, error=error)


def _fail_turn(*, ticket: Ticket, turn: Turn, actor: str, error: Any) -> str:
    _end_turn(turn, TurnState.FAILED)
    _context_entry(ticket, turn, {"error": error}, [])
    lifecycle.transition(
        ticket_id=ticket.id,
        expected=TicketState.RUNNING,
        to=TicketState.FAILED,
        kind="turn_failed",
        actor=actor,
        turn_id=turn.id,
        error=error,
    )
    _record_callback(ticket, actor)
    return TicketState.FAILED


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


def _apply_wait(*, ticket: Ticket, turn: Turn, outcome: Outcome, actor: str) -> str:
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
        return _fail_turn(ticket=ticket, turn=turn, actor=actor, error=error)
    _end_turn(turn, TurnState.COMPLETED)
    _context_entry(ticket, turn, {"waiting_for": children}, [])
    lifecycle.transition(
        ticket_id=ticket.id,
        expected=TicketState.RUNNING,
        to=TicketState.WAITING,
        kind="waiting_for_children",
        actor=actor,
        turn_id=turn.id,
        detail={"children": children, "continuation": wait.continuation},
    )
    return TicketState.WAITING


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


def release_lock(*, endpoint_id: int, turn: Turn) -> None:
    """Release the lock held by ``turn`` (the caller holds the lock row) and,
    after commit, dispatch the endpoint's oldest queued ticket."""
    released = EndpointLock.objects.filter(endpoint_id=endpoint_id, holder=turn).update(
        holder=None, token=None, acquired_at=None
    )
    assert released == 1
    dispatch_next(endpoint_id=endpoint_id)


def _needs_dispatch(ticket_id: uuid.UUID) -> None:
    """The ticket's message was used up without starting it (the caller holds
    the endpoint's lock row): the next release must publish it."""
    Ticket.objects.filter(id=ticket_id, state=TicketState.QUEUED).update(needs_dispatch=True)


def dispatch_next(*, endpoint_id: int) -> None:
    """After a release (the caller holds the lock row): publish, after commit,
    the oldest queued ticket that has no message in flight. Every queued
    ticket either has one in flight or is marked, so nothing is left behind,
    and each turn costs one broker message. The lost-dispatch sweep stays the
    backstop for a message the broker loses."""
    waiting = (
        Ticket.objects.filter(
            endpoint_id=endpoint_id, state=TicketState.QUEUED, needs_dispatch=True
        )
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if waiting is None:
        return
    Ticket.objects.filter(id=waiting).update(needs_dispatch=False)
    publish(RUN_TICKET, str(waiting))


# --- Stale evidence -----------------------------------------------------------------------


def _record_stale(*, turn: Turn, seq: int, kind: str, source: str, detail: dict[str, Any]) -> None:
    """A late or foreign outcome: an event on the ticket, and evidence on the
    open recovery case when the turn is the uncertain one. Nothing else."""
    from recovery.models import CaseEvidence, CaseState, RecoveryCase

    lifecycle.append_event(
        ticket_id=turn.ticket_id,
        kind="stale_outcome",
        actor=f"{source}",
        turn_id=turn.id,
        detail={"seq": seq, "turn_state": turn.state, "outcome": kind, **detail},
    )
    case = (
        RecoveryCase.objects.filter(turn=turn)
        .exclude(state=CaseState.CLOSED)
        .order_by("-opened_at")
        .first()
    )
    if case is not None:
        CaseEvidence.objects.create(
            case=case,
            kind=f"late_{kind}",
            seq=seq,
            detail={"source": source, **detail},
            at=timezone.now(),
        )


# --- Interrupt, budgets and quarantine -------------------------------------------------------


def request_interrupt(*, turn_id: uuid.UUID | None, reason: str, actor: str) -> bool:
    """``running -> interrupting`` for one exact turn; the worker's heartbeat
    sees the flag, a command's process group is signalled by its runner, an
    http agent is asked through its cancel URL (after commit). Returns False
    when the turn was not running (another sweeper got there first)."""
    if turn_id is None:
        return False
    now = timezone.now()
    with transaction.atomic():
        updated = Turn.objects.filter(id=turn_id, state=TurnState.RUNNING).update(
            state=TurnState.INTERRUPTING, interrupt_requested_at=now, interrupt_reason=reason
        )
        if not updated:
            return False
        turn = Turn.objects.select_related("endpoint").get(id=turn_id)
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="interrupt_requested",
            actor=actor,
            turn_id=turn.id,
            detail={"seq": turn.seq, "reason": reason, "grace_s": turn.endpoint.interrupt_grace_s},
        )
        if turn.runner_kind == RunnerKind.HTTP:
            runner, seq = turn.endpoint.runner, turn.seq
            transaction.on_commit(lambda: runners.cancel_http_turn(runner, turn_id, seq))
    log.warning("interrupt requested for turn %s (%s)", turn_id, reason)
    return True


def quarantine_turn(*, turn_id: uuid.UUID) -> uuid.UUID | None:
    """No stop evidence within the grace period: the turn is ``uncertain``,
    its ticket ``recovering``, the endpoint ``quarantined`` (the lock stays
    with the uncertain turn) and a recovery case is opened — one transaction.
    Returns the case id, or None if the turn stopped meanwhile."""
    from recovery.models import CaseState, RecoveryCase

    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        return None
    now = timezone.now()
    with transaction.atomic():
        Ticket.objects.select_for_update().get(id=turn.ticket_id)
        EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
        turn = (
            Turn.objects.select_for_update(of=("self",)).select_related("endpoint").get(id=turn_id)
        )
        grace = timedelta(seconds=turn.endpoint.interrupt_grace_s)
        if turn.state != TurnState.INTERRUPTING or turn.interrupt_requested_at + grace > now:
            return None
        Turn.objects.filter(id=turn.id).update(state=TurnState.UNCERTAIN)
        reason = (
            f"turn {turn.seq} ({turn.runner_kind} runner on {turn.worker.get('host')}:"
            f"{turn.worker.get('pid')}) was interrupted for {turn.interrupt_reason} at "
            f"{turn.interrupt_requested_at.isoformat()} and gave no stop evidence within "
            f"{turn.endpoint.interrupt_grace_s:g}s"
        )
        lifecycle.transition(
            ticket_id=turn.ticket_id,
            expected=TicketState.RUNNING,
            to=TicketState.RECOVERING,
            kind="turn_uncertain",
            actor="sweeper",
            turn_id=turn.id,
            detail={"reason": reason},
        )
        Endpoint.objects.filter(id=turn.endpoint_id).update(state=EndpointState.QUARANTINED)
        case = RecoveryCase.objects.create(
            endpoint_id=turn.endpoint_id,
            turn=turn,
            ticket_id=turn.ticket_id,
            reason=reason,
            state=CaseState.OPEN,
            opened_at=now,
        )
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="endpoint_quarantined",
            actor="sweeper",
            turn_id=turn.id,
            detail={"case": str(case.id), "endpoint": turn.endpoint.address},
        )
    log.error("endpoint %s quarantined: %s (case %s)", turn.endpoint.address, reason, case.id)
    return case.id


# PostgreSQL advisory lock keys: one sweeper of each kind at a time.
_SWEEP_LOCKS = {"budgets": 7_401_001, "dispatch": 7_401_002}


@contextmanager
def _sweep_lock(name: str):
    """Yields True if this process may run the sweep now. A session-level
    advisory lock, so each turn's transition can commit on its own."""
    if connection.vendor != "postgresql":
        yield True  # SQLite serialises writers already
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [_SWEEP_LOCKS[name]])
        got = cur.fetchone()[0]
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [_SWEEP_LOCKS[name]])


@dataclass
class SweepReport:
    interrupted: list[uuid.UUID]
    quarantined: list[uuid.UUID]
    skipped: bool = False


def sweep_budgets() -> SweepReport:
    """Enforce time budgets (DESIGN.md flow 3).

    1. Take the sweep's advisory lock; a second sweeper skips this round.
    2. Running turns past ``deadline_at``, or whose heartbeat is older than
       their endpoint's ``heartbeat_timeout_s``: request an interrupt.
    3. Interrupting turns whose grace has run out with no stop evidence:
       quarantine.
    Each transition is its own conditional transaction, so even without the
    advisory lock two sweepers could not both act on one turn. The query
    reads only active turns (a partial index): the cost follows the number of
    running turns, not the size of the ledger.
    """
    report = SweepReport(interrupted=[], quarantined=[])
    with _sweep_lock("budgets") as mine:
        if not mine:
            report.skipped = True
            return report
        now = timezone.now()
        active = list(Turn.objects.filter(state__in=TURN_ACTIVE_STATES).select_related("endpoint"))
        for turn in active:
            if turn.state == TurnState.RUNNING:
                hb_limit = timedelta(seconds=turn.endpoint.heartbeat_timeout_s)
                reason = (
                    "deadline"
                    if turn.deadline_at <= now
                    else "heartbeat"
                    if turn.heartbeat_at + hb_limit <= now
                    else None
                )
                if reason and request_interrupt(turn_id=turn.id, reason=reason, actor="sweeper"):
                    report.interrupted.append(turn.id)
            elif (
                turn.interrupt_requested_at + timedelta(seconds=turn.endpoint.interrupt_grace_s)
                <= now
            ):
                case = quarantine_turn(turn_id=turn.id)
                if case is not None:
                    report.quarantined.append(case)
    return report


def sweep_lost_dispatches() -> list[uuid.UUID]:
    """Re-publish the oldest queued ticket of each free, available endpoint
    whose queue has waited longer than ``REDISPATCH_AFTER_S`` (the broker lost
    the message, or the publish failed after commit). A duplicate message is
    harmless: the ticket row decides."""
    cutoff = timezone.now() - timedelta(seconds=settings.REDISPATCH_AFTER_S)
    published: list[uuid.UUID] = []
    with _sweep_lock("dispatch") as mine, transaction.atomic():
        if not mine:
            return published
        free = EndpointLock.objects.filter(
            holder__isnull=True, endpoint__state=EndpointState.AVAILABLE
        ).values_list("endpoint_id", flat=True)
        for endpoint_id in free:
            oldest = (
                Ticket.objects.filter(endpoint_id=endpoint_id, state=TicketState.QUEUED)
                .order_by("id")
                .values_list("id", "updated_at")
                .first()
            )
            if oldest and oldest[1] <= cutoff:
                publish(RUN_TICKET, str(oldest[0]))
                published.append(oldest[0])
    if published:
        log.warning("re-dispatched %d queued ticket(s) whose messages were lost", len(published))
    return published


# --- Leaving quarantine (called by recovery decisions only) ------------------------------------


def resolve_uncertain_turn(
    *, turn_id: uuid.UUID, resolution: str, actor: str, evidence: dict[str, Any] | None = None
) -> None:
    """Close an ``uncertain`` turn by an owner decision and let its endpoint
    leave quarantine, in the caller's transaction (the decision's).

    ``resolution`` is ``unresolved`` (finalize/rerun: nobody proved it
    stopped, the owner accepts the risk) or ``stopped`` (release: the owner
    gives evidence that it ended). The lock held by the turn is released and
    the endpoint's oldest queued ticket dispatched after commit.
    """
    if resolution not in (TurnState.UNRESOLVED, TurnState.STOPPED):
        raise ValueError(f"unknown resolution {resolution!r}")
    from config.errors import InvalidTransition

    turn = Turn.objects.filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    with transaction.atomic():
        Ticket.objects.select_for_update().get(id=turn.ticket_id)
        EndpointLock.objects.select_for_update().get(endpoint_id=turn.endpoint_id)
        now = timezone.now()
        fields: dict[str, Any] = {"state": resolution, "ended_at": now}
        if evidence is not None:
            fields["stop_evidence"] = {
                "kind": "owner_evidence",
                "observed_at": now.isoformat(),
                "seq": turn.seq,
                "detail": evidence,
                "actor": actor,
            }
        if not Turn.objects.filter(id=turn_id, state=TurnState.UNCERTAIN).update(**fields):
            raise InvalidTransition(f"turn {turn_id} is not uncertain", state=turn.state)
        EndpointLock.objects.filter(endpoint_id=turn.endpoint_id, holder_id=turn_id).update(
            holder=None, token=None, acquired_at=None
        )
        left = Endpoint.objects.filter(id=turn.endpoint_id, state=EndpointState.QUARANTINED).update(
            state=EndpointState.AVAILABLE
        )
        lifecycle.append_event(
            ticket_id=turn.ticket_id,
            kind="turn_resolved",
            actor=actor,
            turn_id=turn.id,
            detail={"resolution": resolution, "endpoint_released": bool(left)},
        )
        dispatch_next(endpoint_id=turn.endpoint_id)
