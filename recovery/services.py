"""Recovery: owner-only services for quarantined endpoints (DESIGN.md flow 6).

Inspect first (an immutable snapshot that changes nothing else), then an
owner decides (``finalize_orphan``, ``authorize_rerun``, ``keep_quarantined``
or ``release``), then a lesson closes the case. Each service is one
transaction; a case moves ``open -> decided -> closed`` only by a conditional
UPDATE on its expected state, and every decision and lesson leaves an event
on the ticket naming the actor.

Lock order is the runtime's (``Ticket -> EndpointLock -> Turn -> Endpoint``),
with the case row after the ticket: ``_record_stale`` inserts case evidence
while holding the ticket lock, so taking the case first could deadlock.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from datetime import datetime
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core import limits
from core.errors import DedupeConflict, Invalid, InvalidTransition, NotFound
from core.ids import new_id
from endpoints.models import ChangeProposal
from endpoints.proposals import propose_change
from endpoints.selectors import is_owner
from runtime.turns import resolve_uncertain_turn
from tickets import lifecycle
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketState, Turn, TurnState
from tickets.retry import check_budget

from .models import (
    CaseEvidence,
    CaseState,
    Decision,
    DecisionAction,
    Inspection,
    Lesson,
    ProcessStop,
    RecoveryCase,
)
from .selectors import LATE_STOP_RECEIPT, build_snapshot, get_case, snapshot_sha256

log = logging.getLogger(__name__)

MAX_TEXT = limits.TEXT_CHARS
MAX_DEDUPE_KEY = limits.DEDUPE_KEY_CHARS


def actor_name(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


def _require_owner(user: AbstractBaseUser | None, case: RecoveryCase, doing: str) -> None:
    # Cases are seen only by the endpoint's owners and staff (API.md "Who may
    # see and do what"), so to anyone else the case does not exist: 404, as
    # for an unknown id, whatever they were trying to do.
    if not is_owner(user, case.endpoint):
        raise NotFound(f"case {case.id} not found")


def _text(value: Any, name: str, *, required: bool = True) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise Invalid(f"{name} must be text")
    value = value.strip()
    if required and not value:
        raise Invalid(f"{name} must not be empty")
    if len(value) > MAX_TEXT:
        raise Invalid(f"{name} is longer than {MAX_TEXT} characters")
    return value


def _lock_ticket(ticket_id: uuid.UUID) -> Ticket:
    # A row lock, not a write: every runtime change to this ticket, its turn,
    # the endpoint lock and the case's evidence waits until we commit.
    return Ticket.objects.select_for_update().get(id=ticket_id)


def _move_case(case_id: uuid.UUID, *, expected: str, to: str, needs: str, **fields: Any) -> None:
    """``expected -> to`` as one conditional UPDATE; no row means another
    owner (or an earlier call) got there first, and nothing is written."""
    if RecoveryCase.objects.filter(id=case_id, state=expected).update(state=to, **fields):
        return
    current = RecoveryCase.objects.filter(id=case_id).values_list("state", flat=True).first()
    raise InvalidTransition(f"case {case_id} is {current}; {needs}", state=current)


# --- Inspect ----------------------------------------------------------------------------------


def inspect_case(*, case_id: uuid.UUID | str, user: AbstractBaseUser) -> Inspection:
    """Store an immutable snapshot of everything the owner decides on.

    1. Owner (or staff) only.
    2. Lock the ticket row (the runtime locks it first for every change the
       snapshot covers), so the snapshot is one consistent moment.
    3. Build the snapshot, hash its canonical JSON, insert the inspection.
    Nothing else is written: no state, no event. The inspection row is the
    audit record (append-only in the database).
    """
    case = get_case(case_id)
    _require_owner(user, case, "inspect")
    with transaction.atomic():
        _lock_ticket(case.ticket_id)
        case = RecoveryCase.objects.select_related("endpoint", "turn").get(id=case.id)
        snapshot = build_snapshot(case)
        inspection = Inspection.objects.create(
            case=case,
            actor=user,
            snapshot=snapshot,
            sha256=snapshot_sha256(snapshot),
            created_at=timezone.now(),
        )
    return inspection


# --- Decide -----------------------------------------------------------------------------------


def _inspection_of(case: RecoveryCase, inspection_id: Any) -> Inspection:
    """A decision rests on an inspection of *this* case; anything else is a
    bad request (400), not a missing resource."""
    if inspection_id in (None, ""):
        raise Invalid("a decision must rest on an inspection of this case: give its id")
    try:
        inspection_uuid = uuid.UUID(str(inspection_id))
    except (ValueError, TypeError, AttributeError):
        raise Invalid(f"inspection {inspection_id} is not an inspection id") from None
    inspection = Inspection.objects.filter(id=inspection_uuid, case_id=case.id).first()
    if inspection is None:
        raise Invalid(f"inspection {inspection_id} is not an inspection of case {case.id}")
    return inspection


def rerun_key(base: str, n: int) -> str:
    """The re-run's dedupe key, derived from the original's so a repeated
    request converges; hashed when it would pass the key's length cap."""
    key = f"{base}:rerun:{n}"
    if len(key) > MAX_DEDUPE_KEY:
        key = f"{hashlib.sha256(base.encode()).hexdigest()}:rerun:{n}"
    return key


def _admit_rerun(
    *,
    original: Ticket,
    address: str,
    actor: str,
    input: dict[str, Any] | None = None,  # noqa: A002 - the contract's name
    budget_s: int | None = None,
) -> Ticket:
    """A new ticket with a new identity: new id, new dedupe key, parent = the
    original (so the same trace, one deeper, counted by the trace's circuit
    breaker), the original's input unless the owner gave another, same
    endpoint and requester, and the owner's per-ticket budget if any (set in
    this transaction, before the dispatcher is woken at commit). Admission
    publishes it after commit like any other ticket."""
    base = original.dedupe_key or str(original.id)
    n = (
        Decision.objects.filter(
            case__ticket_id=original.id, action=DecisionAction.AUTHORIZE_RERUN
        ).count()
        + 1
    )
    while Ticket.objects.filter(
        endpoint_id=original.endpoint_id, dedupe_key=rerun_key(base, n)
    ).exists():
        n += 1  # somebody's own ticket already uses the derived key
    key = rerun_key(base, n)
    admitted = admit_ticket(
        endpoint=address,
        input=original.input if input is None else input,
        dedupe_key=key,
        parent_id=original.id,
        rerun_of_id=original.id,
        # A child's re-run answers the parent its original was dispatched by
        # (DESIGN.md flow 7): same return_to and continuation.
        return_to=original.return_to.address if original.return_to_id else None,
        continuation=original.continuation,
        requester=original.requester,
        submitted_by_id=original.submitted_by_id,
        actor=actor,
    )
    if admitted.duplicate:
        # Only a concurrent admission with the same key and input gets here:
        # a re-run must be a new ticket, never somebody else's.
        raise DedupeConflict(
            f"dedupe key {key!r} was taken meanwhile by ticket {admitted.ticket.id}",
            ticket=str(admitted.ticket.id),
        )
    if budget_s is not None:
        lifecycle.update_fields(
            ticket_id=admitted.ticket.id,
            kind="budget_set",
            actor=actor,
            detail={"budget_s": budget_s},
            budget_s=budget_s,
        )
    return admitted.ticket


def decide(
    *,
    case_id: uuid.UUID | str,
    user: AbstractBaseUser,
    action: str,
    inspection_id: uuid.UUID | str | None,
    rationale: str | None,
    evidence: str | None = "",
    rerun_input: dict[str, Any] | None = None,
    rerun_budget_s: int | None = None,
) -> Decision:
    """Record an owner's decision on an open case and carry it out.

    1. Owner only; a non-empty rationale; ``release`` needs evidence text;
       the inspection must be one of this case (400 otherwise).
    2. Lock the ticket, then the case; the case must still be ``open`` (409).
    3. By action:
       - ``keep_quarantined``: nothing changes, the case stays open.
       - ``finalize_orphan``: the uncertain turn is closed ``unresolved``,
         the endpoint leaves quarantine, ticket ``recovering -> orphaned``
         with no result.
       - ``authorize_rerun``: as finalize, plus a re-run ticket (new identity,
         parent = the original) admitted and dispatched after commit, with
         ``rerun_input`` instead of the original's input and
         ``rerun_budget_s`` (at most the endpoint's budget) if given.
       - ``release``: the turn is closed ``stopped`` on the owner's evidence,
         the endpoint leaves quarantine, ticket ``recovering -> failed``.
       Every action but ``keep_quarantined`` moves the case ``open -> decided``.
    4. Insert the decision and a ``recovery_decision`` event naming the actor.
    """
    case = get_case(case_id)
    _require_owner(user, case, "decide on")
    if action not in DecisionAction.values:
        raise Invalid(f"action must be one of {', '.join(DecisionAction.values)}")
    rationale = _text(rationale, "rationale")
    evidence = _text(evidence, "evidence", required=action == DecisionAction.RELEASE)
    inspection = _inspection_of(case, inspection_id)
    if action != DecisionAction.AUTHORIZE_RERUN and (
        rerun_input is not None or rerun_budget_s is not None
    ):
        raise Invalid("input and budget_s change a re-run: only authorize_rerun takes them")
    if rerun_input is not None and not isinstance(rerun_input, dict):
        raise Invalid("input must be a JSON object")
    rerun_budget_s = check_budget(rerun_budget_s, case.endpoint)
    actor = actor_name(user)
    username = user.get_username()
    decision_id = new_id()
    refs = {"case": str(case.id), "decision": str(decision_id)}
    now = timezone.now()

    with transaction.atomic():
        ticket = _lock_ticket(case.ticket_id)
        locked = RecoveryCase.objects.select_for_update(no_key=True).get(id=case.id)
        if locked.state != CaseState.OPEN:
            raise InvalidTransition(
                f"case {case.id} is {locked.state}: only an open case takes decisions",
                state=locked.state,
            )
        seq = case.turn.seq
        rerun: Ticket | None = None

        if action == DecisionAction.RELEASE:
            late_receipt = CaseEvidence.objects.filter(
                case_id=case.id, kind=LATE_STOP_RECEIPT, seq=seq
            ).exists()
            resolve_uncertain_turn(
                turn_id=case.turn_id,
                resolution=TurnState.STOPPED,
                actor=actor,
                evidence={"text": evidence, "late_stop_receipt": late_receipt, **refs},
            )
            lifecycle.transition(
                ticket_id=ticket.id,
                expected=TicketState.RECOVERING,
                to=TicketState.FAILED,
                kind="released",
                actor=actor,
                turn_id=case.turn_id,
                detail=refs,
                error={
                    "code": "released",
                    "detail": f"released by owner {username} after evidence that turn {seq} "
                    "ended; its outcome was not accepted",
                    **refs,
                },
            )
        elif action in (DecisionAction.FINALIZE_ORPHAN, DecisionAction.AUTHORIZE_RERUN):
            resolve_uncertain_turn(
                turn_id=case.turn_id, resolution=TurnState.UNRESOLVED, actor=actor
            )
            if action == DecisionAction.AUTHORIZE_RERUN:
                rerun = _admit_rerun(
                    original=ticket,
                    address=case.endpoint.address,
                    actor=actor,
                    input=rerun_input,
                    budget_s=rerun_budget_s,
                )
                refs["rerun_ticket"] = str(rerun.id)
            lifecycle.transition(
                ticket_id=ticket.id,
                expected=TicketState.RECOVERING,
                to=TicketState.ORPHANED,
                kind="orphaned",
                actor=actor,
                turn_id=case.turn_id,
                detail=refs,
                # No result: nobody knows what the uncertain turn did, and a
                # response is never invented.
                error={
                    "code": "orphaned",
                    "detail": f"finalized by owner {username}: turn {seq} could not be "
                    "proven stopped and its outcome is unknown",
                    **refs,
                },
            )

        if action != DecisionAction.KEEP_QUARANTINED:
            _move_case(
                case.id,
                expected=CaseState.OPEN,
                to=CaseState.DECIDED,
                needs="only an open case takes decisions",
                decided_at=now,
            )
        decision = Decision.objects.create(
            id=decision_id,
            case_id=case.id,
            actor=user,
            action=action,
            rationale=rationale,
            evidence=evidence,
            inspection=inspection,
            rerun_ticket=rerun,
            created_at=now,
        )
        newer_evidence = CaseEvidence.objects.filter(
            case_id=case.id, at__gt=inspection.created_at
        ).count()
        lifecycle.append_event(
            ticket_id=ticket.id,
            kind="recovery_decision",
            actor=actor,
            turn_id=case.turn_id,
            detail={
                **refs,
                "action": action,
                "inspection": str(inspection.id),
                "inspection_sha256": inspection.sha256,
                # Evidence that arrived after the inspection the decision rests
                # on: the owner did not see it.
                "evidence_since_inspection": newer_evidence,
            },
        )
    return decision


# --- Lesson -----------------------------------------------------------------------------------


def write_lesson(
    *,
    case_id: uuid.UUID | str,
    user: AbstractBaseUser,
    what_failed: str | None,
    evidence: str | None,
    prevention: str | None,
    proposal: dict[str, Any] | None = None,
) -> Lesson:
    """What failed, what evidence made the diagnosis possible, what would
    prevent it: the case goes ``decided -> closed``. A case that only has
    ``keep_quarantined`` decisions is still open and takes no lesson yet.

    ``proposal`` (``{changes, generation, reason?}``): the lesson also
    proposes a change of the case's endpoint against that generation, in
    the same transaction (``propose_from_lesson``): a refused proposal
    writes no lesson either."""
    case = get_case(case_id)
    _require_owner(user, case, "write the lesson of")
    what_failed = _text(what_failed, "what_failed")
    evidence = _text(evidence, "evidence")
    prevention = _text(prevention, "prevention")
    actor = actor_name(user)
    now = timezone.now()
    with transaction.atomic():
        _move_case(
            case.id,
            expected=CaseState.DECIDED,
            to=CaseState.CLOSED,
            needs="a lesson closes a decided case",
            closed_at=now,
        )
        lesson = Lesson.objects.create(
            case_id=case.id,
            actor=user,
            what_failed=what_failed,
            evidence=evidence,
            prevention=prevention,
            created_at=now,
        )
        lifecycle.append_event(
            ticket_id=case.ticket_id,
            kind="lesson_written",
            actor=actor,
            turn_id=case.turn_id,
            detail={"case": str(case.id), "lesson": str(lesson.id)},
        )
        if proposal is not None:
            _propose(case, lesson, user=user, proposal=proposal)
    return lesson


def propose_from_lesson(
    *, case_id: uuid.UUID | str, user: AbstractBaseUser, proposal: dict[str, Any]
) -> ChangeProposal:
    """A change of the case's endpoint proposed from its lesson (the case
    must be closed), linked to the case and the lesson (its ``origin``)."""
    case = get_case(case_id)
    _require_owner(user, case, "propose a change from the lesson of")
    lesson = Lesson.objects.filter(case_id=case.id).first()
    if lesson is None:
        raise InvalidTransition(
            f"case {case.id} has no lesson yet: a proposal follows the lesson",
            state=case.state,
        )
    return _propose(case, lesson, user=user, proposal=proposal)


def _propose(
    case: RecoveryCase, lesson: Lesson, *, user: AbstractBaseUser, proposal: dict[str, Any]
) -> ChangeProposal:
    if not isinstance(proposal, dict):
        raise Invalid("proposal must be {changes, generation, reason}")
    reason = proposal.get("reason") or f"lesson of case {case.id}: {lesson.prevention}"
    return propose_change(
        address=case.endpoint.address,
        user=user,
        base_generation=proposal.get("generation"),
        changes=proposal.get("changes"),
        reason=reason[: limits.NOTE_CHARS],
        origin={"lesson": str(lesson.id), "case": str(case.id)},
    )


# --- Records the runtime asks for (runtime.ports.CaseKeeper) ------------------------------


def open_case_for_uncertain_turn(*, turn: Turn, reason: str, at: datetime) -> uuid.UUID:
    """Open the case of a turn the runtime has just found uncertain, in the
    runtime's transaction (the quarantine's): the case and the quarantine
    commit together or not at all."""
    case = RecoveryCase.objects.create(
        endpoint_id=turn.endpoint_id,
        turn=turn,
        ticket_id=turn.ticket_id,
        reason=reason,
        state=CaseState.OPEN,
        opened_at=at,
    )
    return case.id


def record_late_evidence(
    *, turn: Turn, kind: str, seq: int, source: str, detail: dict[str, Any]
) -> None:
    """A late or foreign outcome or heartbeat about ``turn``: evidence on its
    open case, when it has one (the uncertain turn's), in the caller's
    transaction. Evidence kinds are ``late_<outcome kind>``."""
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


def stop_process(
    *, case_id: uuid.UUID | str, user: AbstractBaseUser, rationale: str | None
) -> ProcessStop:
    """An owner's "stop the process" for an inline turn that still holds a
    worker slot after its case was decided (docs/explanation/design.md, "Reclaiming a
    slot"). Recorded like a decision (actor, rationale, a ticket event); the
    kill is carried out after commit by the worker on the recorded host,
    targeting the recorded pid, only while its slot still names this turn.
    Never ``revoke(terminate=True)``, never a kill by task id."""
    from runtime.registry import request_process_stop
    from runtime.selectors import slot_holding

    case = get_case(case_id)
    _require_owner(user, case, "stop the process of")
    rationale = _text(rationale, "rationale")
    if case.state == CaseState.OPEN:
        raise InvalidTransition(
            f"case {case.id} is open: decide it before stopping its turn's process",
            state=case.state,
        )
    slot = slot_holding(case.turn_id)
    if slot is None:
        raise InvalidTransition(
            f"no live worker process holds turn {case.turn_id}", state=case.state
        )
    actor = actor_name(user)
    now = timezone.now()
    with transaction.atomic():
        stop = ProcessStop.objects.create(
            case=case,
            actor=user,
            rationale=rationale,
            worker=slot.worker.name,
            host=slot.worker.host,
            pid=slot.pid,
            created_at=now,
        )
        lifecycle.append_event(
            ticket_id=case.ticket_id,
            kind="process_stop_requested",
            actor=actor,
            turn_id=case.turn_id,
            detail={
                "case": str(case.id),
                "stop": str(stop.id),
                "worker": stop.worker,
                "host": stop.host,
                "pid": stop.pid,
                "rationale": rationale,
            },
        )
        # The decision the stop carries out: the worker's log names it.
        decision = (
            Decision.objects.filter(case_id=case.id)
            .exclude(action=DecisionAction.KEEP_QUARANTINED)
            .order_by("-created_at")
            .values_list("id", flat=True)
            .first()
        )
        args = {
            "stop_id": str(stop.id),
            "turn_id": str(case.turn_id),
            "pid": stop.pid,
            "host": stop.host,
            "decision": str(decision or ""),
        }
        transaction.on_commit(lambda: request_process_stop(stop.worker, **args))
    return stop


# The worker kills within this long of the request and then reports: a slot
# found free before it is the worker's own doing, about to be reported.
PROCESS_STOP_REPORT_GRACE_S = 15.0


def resolve_process_stop(
    *, stop_id: uuid.UUID | str, outcome: str, reason: str, actor: str, detail: dict | None = None
) -> bool:
    """Close a stop request that ends without a kill: ``gone`` (the process
    no longer runs the turn: nothing is left to stop), ``refused`` (the
    worker it reached will not kill that pid) or ``unreachable`` (no worker
    can carry it out any more). Only from ``requested``; the reason is
    recorded on the stop and as a ticket event. False when another resolver
    (the worker's report, a sweep) got there first."""
    if outcome not in ("gone", "refused", "unreachable"):
        raise ValueError(f"unknown stop outcome {outcome!r}")
    now = timezone.now()
    with transaction.atomic():
        closed = ProcessStop.objects.filter(id=stop_id, outcome="requested").update(
            outcome=outcome, exit={"reason": reason, **(detail or {})}, done_at=now
        )
        if not closed:
            return False
        stop = ProcessStop.objects.select_related("case").get(id=stop_id)
        lifecycle.append_event(
            ticket_id=stop.case.ticket_id,
            kind="process_stop_resolved",
            actor=actor,
            turn_id=stop.case.turn_id,
            detail={"stop": str(stop.id), "pid": stop.pid, "outcome": outcome, "reason": reason},
        )
    log.warning("stop of process %s on %s: %s (%s)", stop.pid, stop.worker, outcome, reason)
    return True


def resolve_stale_stops() -> list[uuid.UUID]:
    """The stop requests no worker will carry out any more, closed with the
    reason (run by the budget sweep):

    1. the named worker is no longer registered, or registered again since
       the request (a restart: its pool processes and their pids are new),
       or on another host;
    2. it is lost (no heartbeat for ``WORKER_LOST_AFTER_S``);
    3. past the report grace, its slot no longer runs the turn (the turn
       ended, the process exited): ``gone``;
    4. no report within ``PROCESS_STOP_TIMEOUT_S`` (the request was lost
       with the broker, or the worker ignored it).

    Everything else stays ``requested``: the worker may still report."""
    from datetime import timedelta

    from django.conf import settings

    from runtime.models import Worker
    from runtime.selectors import slot_runs

    now = timezone.now()
    lost_before = now - timedelta(seconds=settings.WORKER_LOST_AFTER_S)
    closed: list[uuid.UUID] = []
    for stop in ProcessStop.objects.filter(outcome="requested").select_related("case"):
        age = (now - stop.created_at).total_seconds()
        worker = Worker.objects.filter(name=stop.worker).first()
        if worker is None:
            verdict = ("unreachable", "the worker is no longer registered")
        elif worker.started_at > stop.created_at or worker.host != stop.host:
            verdict = (
                "unreachable",
                f"the worker restarted on {worker.host} after the request; the pid is not its own",
            )
        elif worker.last_seen_at < lost_before:
            verdict = (
                "unreachable",
                f"the worker is lost (no heartbeat for {settings.WORKER_LOST_AFTER_S:g} s)",
            )
        elif age > PROCESS_STOP_REPORT_GRACE_S and not slot_runs(
            worker.name, stop.pid, stop.case.turn_id
        ):
            verdict = ("gone", "the process no longer runs the turn")
        elif age > settings.PROCESS_STOP_TIMEOUT_S:
            verdict = (
                "unreachable",
                f"no report from the worker within {settings.PROCESS_STOP_TIMEOUT_S:g} s",
            )
        else:
            continue
        if resolve_process_stop(
            stop_id=stop.id, outcome=verdict[0], reason=verdict[1], actor="sweeper"
        ):
            closed.append(stop.id)
    return closed


def record_process_exit(*, stop_id: str, outcome: str, exit: dict[str, Any]) -> None:
    """The worker's report of a "stop the process": the stop's outcome, and
    the exit as late evidence on the case (kind ``late_process_exit``)."""
    with transaction.atomic():
        stop = (
            ProcessStop.objects.select_for_update()
            .select_related("case__turn")
            .filter(id=stop_id, outcome="requested")
            .first()
        )
        if stop is None:
            return
        now = timezone.now()
        ProcessStop.objects.filter(id=stop.id).update(outcome=outcome, exit=exit, done_at=now)
        CaseEvidence.objects.create(
            case=stop.case,
            kind="late_process_exit",
            seq=stop.case.turn.seq,
            detail={"source": f"worker:{stop.worker}", "stop": str(stop.id), **exit},
            at=now,
        )
