"""Finishing the exact turn: its outcome applied (result, failure, wait
for children, a stop), the context entry, the delivery and the lock released
by one database function -- or refused as stale evidence -- and around it a
callback's resume and the callback records."""

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

from core.canonical import canonical_json
from core.dispatch import DISPATCH_CHANNEL
from core.errors import DomainError, StaleTurn
from core.wakes import wake
from tickets import lifecycle, terminal
from tickets.admission import admit_ticket
from tickets.models import (
    CallbackState,
    ContextEntry,
    EndpointLock,
    Ticket,
    TicketState,
    Turn,
    TurnState,
)
from tickets.rights import AskingTurn
from tickets.turns import finish as finish_call
from tickets.turns.finish import Written as _Written
from tickets.turns.start import (
    Credentials,
    Started,
    report_started,
    started_by,
)
from tickets.waits import TICKET_CHANNEL

from .. import runners
from ..ports import case_keeper
from ..runners import Outcome
from .dispatch import publish_next, redispatch_if_free

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
    # The finish let go of the worker's slot (and named it on the turn it started).
    slot_recorded: bool = False
    # With ``start_next``: the endpoint's next turn, started in the finishing
    # transaction, for the caller to run.
    started: Started | None = None


class _Refused(Exception):
    """The function refused a wait's outcome: undo the children admitted for it."""

    def __init__(self, written: _Written) -> None:
        super().__init__(written.reason)
        self.written = written


_KINDS = ("success", "failure", "wait", "stopped")


def finish_turn(
    *,
    turn_id: uuid.UUID,
    seq: int,
    outcome: Outcome,
    source: str,
    strict: bool = False,
    turn: Turn | None = None,
    slot: tuple[str, int] | None = None,
    start_next: bool = False,
    celery_task_id: str = "",
    ran_s: float | None = None,
) -> Finished:
    """Accept a turn's outcome only from the exact turn (DESIGN.md flow 2).

    The transition is the database function ``claimcheck_finish_turn``
    (tickets/sql/claimcheck_finish_turn.sql), one statement:

    1. Lock ticket, lock row, turn (in that order).
    2. Exact means: ticket.turn, lock.holder and the turn are the same, the
       lock token, the turn's seq and the given seq are equal, and the turn is
       still active. A turn that already ended with this very outcome (the
       same ``outcome_sha256`` on its terminal event: an earlier attempt
       committed and lost its reply in a database blip) is a duplicate:
       nothing is written again and the caller gets the recorded state.
       Anything else is recorded as evidence (a ``stale_outcome`` event, and
       on the recovery case when the turn is uncertain) and changes nothing;
       with ``strict`` the caller gets ``StaleTurn``.
    3. An interrupted turn, or stop evidence, ends as ``stopped``: the ticket
       fails as timed out (or is cancelled, when a cancel asked for it) --
       unless the outcome is a *late outcome* the turn produced before the
       interrupt was requested (below): that is the turn's result, step 4.
    4. Otherwise apply the outcome: success / failure / wait for children;
       the context entry; the ticket's move, its event and, for a terminal
       ticket that answers a requester, its delivery -- from the parts
       every move of a ticket shares (``claimcheck_ticket_owes``,
       ``claimcheck_ticket_write``: tickets/lifecycle.py).
    5. Release the lock (``claimcheck_release_lock``): the endpoint's next
       marked ticket is unmarked and published after commit, or the
       dispatcher is woken; the worker's slot lets go of the turn. With
       ``start_next`` (a worker running a backlog) that ticket is not
       published: the function starts the endpoint's next turn itself
       (``claimcheck_start_turn``, every guard of a start), in the same
       transaction, carrying ``celery_task_id``: ``Finished.started``, for
       the caller to run. One commit per ticket of a backlog instead of two.

    Around the function, in its transaction, the work of other services: a
    wait's children are admitted first (undone if the outcome is refused; a
    child that cannot be admitted fails the turn instead), and after it a
    callback turn's resume of the ticket it reports to, the callback record
    of a callback ticket, and what the move leaves to Python
    (``tickets.terminal.after_move``, as for every move: the callback a
    child owes its parent, a due delivery's send, the wake, the metrics). A
    root ticket's turn that succeeded or failed needs no transaction of its
    own: one statement in autocommit, then ``after_move``'s publishes.

    A late outcome (docs/explanation/design.md, "A late outcome"): the finish of the
    exact turn that finds it ``interrupting`` is its result when the runner
    ran to an outcome (success, failure, wait), the worker sent its run time
    ``ran_s`` (its monotonic clock, from before it sent the start to when
    the runner returned), ``started_at + ran_s < interrupt_requested_at``
    (both the database's clock) and ``ran_s <= turn_budget_s +
    interrupt_grace_s``. Otherwise the turn stops, and its ``turn_stopped``
    event keeps ``ran_s`` and ``returned_by`` as evidence. The worker's first
    reading precedes ``started_at``, so ``returned_by`` never precedes the
    real return: clock skew between hosts does not enter, and the error
    only ever refuses a result, never accepts one.
    """
    digest = outcome_digest(outcome)
    outcome = _externalize(outcome, turn_id)
    # Which ticket and endpoint to lock (immutable columns), and whether the
    # ticket reports to another (ditto): from the caller's copy of the turn
    # and its ticket when it has them, else one read.
    if turn is None or turn.id != turn_id or not Turn.ticket.is_cached(turn):
        turn = Turn.objects.select_related("ticket").filter(id=turn_id).first()
    if turn is None:
        raise StaleTurn(f"turn {turn_id} does not exist", state=None)
    ticket = turn.ticket
    kind, error = outcome.kind, outcome.error
    if kind not in _KINDS:
        kind, error = "failure", {"code": "bad_outcome", "detail": f"runner outcome {kind!r}"}
    actor = f"turn:{seq}:{source}"
    call = {
        "turn": turn,
        "seq": seq,
        "kind": kind,
        "outcome": outcome,
        "error": error,
        "source": source,
        "digest": digest,
        "ran_s": ran_s,
        "slot": slot,
        "start_next": start_next,
        "celery_task_id": celery_task_id,
    }
    reports = ticket.callback_for_id is not None or ticket.return_to_id is not None
    if kind == "wait":
        written = _finish_wait(call, ticket=ticket, actor=actor)
    elif outcome.resume is not None or reports:
        with transaction.atomic():
            written = _call(**call)
            if written.status == "finished":
                _after(ticket=ticket, turn=turn, written=written, outcome=outcome, actor=actor)
    else:
        # One statement in autocommit: what the move leaves to Python runs
        # after its commit (a publish, a wake, the metrics; no callback).
        written = _call(**call)
        if written.status == "finished":
            _after(ticket=ticket, turn=turn, written=written, outcome=outcome, actor=actor)
    return _answer(
        written,
        turn=turn,
        seq=seq,
        kind=kind,
        source=source,
        strict=strict,
        slot=slot,
        start_next=start_next,
        celery_task_id=celery_task_id,
        outcome=outcome,
        ran_s=ran_s,
    )


def _admit_children(wait, *, parent: Ticket, turn: Turn, actor: str, key_prefix: str) -> list[str]:
    """Admit a wait's children under ``parent``, each returning to the turn's
    endpoint with the wait's continuation, all or none (a savepoint): the
    ids in order, or the first child's DomainError. A child without its own
    dedupe key gets ``<key_prefix>/child/<i>``, stable across a retry. Each
    carries the rights of its trace's submitter or of the turn's owners
    (tickets/rights.py): a target neither may submit to is ``forbidden``."""
    children: list[str] = []
    asked_by = AskingTurn(endpoint_id=turn.endpoint_id, generation=turn.generation)
    with transaction.atomic():
        for i, child in enumerate(wait.children):
            admitted = admit_ticket(
                endpoint=child.endpoint,
                input=child.input,
                dedupe_key=child.dedupe_key or f"{key_prefix}/child/{i}",
                parent_id=parent.id,
                return_to=turn.endpoint.address,
                continuation=wait.continuation,
                asked_by=asked_by,
                actor=actor,
            )
            children.append(str(admitted.ticket.id))
    return children


def _finish_wait(call: dict[str, Any], *, ticket: Ticket, actor: str) -> _Written:
    """A wait for children: the children are admitted in the finishing
    transaction, before the function (which records their ids), so a refused
    outcome leaves none behind; a child that cannot be admitted fails the turn."""
    turn, wait = call["turn"], call["outcome"].wait
    try:
        with transaction.atomic():
            try:
                children = _admit_children(
                    wait, parent=ticket, turn=turn, actor=actor, key_prefix=f"{ticket.id}"
                )
            except DomainError as exc:
                error = {"code": exc.code, "detail": f"cannot dispatch children: {exc.detail}"}
                written = _call(**{**call, "kind": "failure", "error": error})
            else:
                written = _call(**call, children=children)
            if written.status == "finished":
                _after(
                    ticket=ticket, turn=turn, written=written, outcome=call["outcome"], actor=actor
                )
                if call["outcome"].artifacts:
                    # An agent's messages so far (runtime/agents/memory.py):
                    # the function writes a wait's context entry without
                    # artifacts; this exact turn's entry gets them here, in
                    # the same transaction.
                    ContextEntry.objects.filter(turn_id=turn.id).update(
                        artifacts=call["outcome"].artifacts
                    )
            elif children:
                raise _Refused(written)
    except _Refused:
        # Nothing of it stays; the refusal itself is recorded as evidence.
        written = _call(**call, children=[])
    return written


def _call(
    *,
    turn: Turn,
    seq: int,
    kind: str,
    outcome: Outcome,
    error: Any,
    source: str,
    digest: str,
    ran_s: float | None,
    slot: tuple[str, int] | None,
    start_next: bool,
    celery_task_id: str,
    children: list[str] | None = None,
) -> _Written:
    wait = outcome.wait
    # A fresh turn id and token for each attempt: a retry after a lost reply
    # finds the turn an earlier one started (``_answer``, duplicate).
    nxt = Credentials.new(celery_task_id=celery_task_id, slot=slot) if start_next else None
    written = finish_call.finish(
        turn=turn,
        seq=seq,
        kind=kind,
        result=outcome.result,
        artifacts=outcome.artifacts,
        error=error,
        evidence=outcome.evidence,
        children=children,
        continuation=wait.continuation if wait is not None else None,
        stale_detail=_evidence_detail(outcome),
        digest=digest,
        source=source,
        ran_s=ran_s,
        slot=slot,
        next_turn=nxt,
    )
    _wake(written, ticket_id=turn.ticket_id)
    return written


def _wake(written: _Written, *, ticket_id: uuid.UUID) -> None:
    """The listeners a finish concerns, woken after its commit (the
    function notifies nothing: core/wakes.py says why): the ticket's
    watchers when it recorded a stale outcome (a move's own wake is
    ``after_move``'s), the next ticket's when it started one, and the
    dispatcher when the lock was released with no ticket left to publish
    (an admission committing meanwhile may have found the lock held; a wake
    too many costs the dispatcher one pass)."""
    if written.status == "stale":
        wake(TICKET_CHANNEL, str(ticket_id))
    if written.status != "finished":
        return
    if written.started is not None:
        wake(TICKET_CHANNEL, str(written.started.ticket.id))
    elif written.next_ticket is None:
        wake(DISPATCH_CHANNEL)


def _after(*, ticket: Ticket, turn: Turn, written: _Written, outcome: Outcome, actor: str) -> None:
    """Other services' work in the finishing transaction (the caller's),
    then what the ticket's move leaves to Python (``terminal.after_move``,
    the same as for every other move of a ticket)."""
    if outcome.resume is not None and written.turn_state == TurnState.COMPLETED:
        _apply_resume(ticket=ticket, turn=turn, resume=outcome.resume, actor=actor)
    # A waiting ticket is not done: its callback is recorded when it is.
    if written.ticket_state != TicketState.WAITING and written.turn_state in (
        TurnState.COMPLETED,
        TurnState.FAILED,
    ):
        _record_callback(ticket, actor)
    terminal.after_move(
        ticket_id=ticket.id,
        expected=TicketState.RUNNING,
        to=written.ticket_state,
        kind=_EVENT_KIND.get(written.turn_state, "turn_failed"),
        turn_id=turn.id,
        moved=terminal.Moved(
            delivery=written.delivery,
            due=written.due,
            # An immutable column: the caller's copy of the ticket has it.
            reports=ticket.return_to_id is not None,
        ),
    )


def _answer(
    written: _Written,
    *,
    turn: Turn,
    seq: int,
    kind: str,
    source: str,
    strict: bool,
    slot: tuple[str, int] | None,
    start_next: bool,
    celery_task_id: str,
    outcome: Outcome,
    ran_s: float | None,
) -> Finished:
    if written.status == "missing":
        raise StaleTurn(written.reason, state=None)
    if written.status == "stale":
        # The event is written; evidence on the turn's case, if it has one.
        turn.state = written.turn_state
        case_keeper().record_late_evidence(
            turn=turn, kind=kind, seq=seq, source=source, detail=_evidence_detail(outcome)
        )
        log.warning("stale outcome for turn %s refused: %s", turn.id, written.reason)
        if strict:
            raise StaleTurn(written.reason, state=written.turn_state)
        return Finished(accepted=False, reason=written.reason)
    if written.status == "duplicate":
        # The attempt that committed may have started the next turn: this
        # worker runs it (a new token: only the hash was kept).
        started = started_by(celery_task_id) if start_next and celery_task_id else None
        if started is None:
            lock = EndpointLock.objects.get(endpoint_id=turn.endpoint_id)
            redispatch_if_free(lock)
        log.warning(
            "turn %s seq %s had already finished with this outcome (an earlier attempt "
            "committed): nothing recorded again; ticket %s is %s",
            turn.id,
            seq,
            turn.ticket_id,
            written.ticket_state,
        )
        if started is not None:
            report_started(started)
        return Finished(
            accepted=True, ticket_state=written.ticket_state, duplicate=True, started=started
        )
    # The next ticket's message, at commit (the move's own duties were
    # after_move's, in _after).
    if written.next_ticket is not None:
        publish_next(written.next_ticket)
    if kind != "stopped" and written.turn_state == TurnState.STOPPED:
        log.warning(
            "turn %s seq %s: its outcome (%s, ran %s s) came after its interrupt: stopped",
            turn.id,
            seq,
            kind,
            None if ran_s is None else round(ran_s, 3),
        )
    log.info(
        "turn %s seq %s finished: ticket %s %s", turn.id, seq, turn.ticket_id, written.ticket_state
    )
    if written.started is not None:  # after the lines about the turn that ended
        report_started(written.started)
    return Finished(
        accepted=True,
        ticket_state=written.ticket_state,
        slot_recorded=slot is not None,
        started=written.started,
    )


_EVENT_KIND = {
    TurnState.COMPLETED: "turn_completed",
    TurnState.FAILED: "turn_failed",
    TurnState.STOPPED: "turn_stopped",
}


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


def _apply_resume(*, ticket: Ticket, turn: Turn, resume: runners.Resume, actor: str) -> None:
    """A callback's or approval's turn completes (or keeps waiting) the
    ticket it answers. Only a waiting ticket of this same endpoint that the
    turn's ticket answers (``answers``) can be resumed; anything else is
    recorded and refused, or ignored (a repeated callback after completion)."""
    try:
        target_id = uuid.UUID(str(resume.ticket))
    except ValueError:
        target_id = None
    target = Ticket.objects.select_for_update().filter(id=target_id).first() if target_id else None
    why = None
    if target is None or target.endpoint_id != turn.endpoint_id:
        why = "not a ticket of this endpoint"
    elif not answers(ticket, target):
        why = "it answers no call of this ticket"
    if why is not None:
        lifecycle.append_event(
            ticket_id=ticket.id,
            kind="resume_refused",
            actor=actor,
            turn_id=turn.id,
            detail={"target": str(resume.ticket), "why": why},
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
    if resume.wait is not None:
        _wait_again(ticket=ticket, target=target, turn=turn, wait=resume.wait, actor=actor)
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
        error = resume.error if isinstance(resume.error, dict) else {"detail": resume.error}
        _end_wait(
            ticket=ticket, target=target, turn=turn, actor=actor, to=TicketState.FAILED, error=error
        )
    else:
        _end_wait(
            ticket=ticket,
            target=target,
            turn=turn,
            actor=actor,
            to=TicketState.SUCCEEDED,
            result=resume.result,
        )


# A re-run or a callback hangs under the ticket it re-runs or reports
# (parent = rerun_of, parent = callback_for); a chain longer than this is
# not one the runtime writes.
_ANSWER_CHAIN_MAX = 64


def answers(ticket: Ticket, target: Ticket) -> bool:
    """Whether ``ticket`` may resume the waiting ``target`` (docs/explanation/design.md,
    "Who completes a waiting ticket"): up through its re-runs and its
    callback link it reaches either a child of ``target`` (through a
    callback: the child's answer) or, with no callback link, ``target``'s
    own approval ticket (runtime-admitted, same endpoint, its key
    ``approval:<target>:...``). recovery/audit.py checks the same rule."""
    node, via_callback = ticket, False
    for _ in range(_ANSWER_CHAIN_MAX):
        parent = node.parent_id
        if parent is None:
            return False
        if node.callback_for_id == parent:
            via_callback = True
        elif node.rerun_of_id != parent:
            break
        node = Ticket.objects.filter(id=parent).first()
        if node is None:
            return False
    else:
        return False
    if node.parent_id != target.id:
        return False
    if via_callback:
        return True
    return (
        node.endpoint_id == target.endpoint_id
        and node.callback_for_id is None
        and node.submitted_by_id is None
        and (node.dedupe_key or "").startswith(f"approval:{target.id}:")
    )


def _end_wait(*, ticket: Ticket, target: Ticket, turn: Turn, actor: str, **ended) -> None:
    """The waiting ticket ``target`` resumed to its end (``to`` with its
    result or error) by ``turn``, the turn of the callback ``ticket``."""
    lifecycle.transition(
        ticket_id=target.id,
        expected=TicketState.WAITING,
        kind="resumed",
        actor=actor,
        turn_id=turn.id,
        completed_by_turn=turn,
        detail={"callback": str(ticket.id)},
        **ended,
    )


def _wait_again(
    *, ticket: Ticket, target: Ticket, turn: Turn, wait: runners.Wait, actor: str
) -> None:
    """Another round of a resumed agent: the waiting ticket (the exchange)
    stays waiting, now on new children of its own (admitted here, each
    carrying ``wait.continuation`` back in its callback), and a
    ``waiting_again`` event records the round's children and continuation
    (what its approvals and the next resume read). The callback or approval
    ticket whose turn this is waits on nothing: it succeeds. A child that
    cannot be admitted fails the waiting ticket, as it fails a first wait."""
    try:
        children = _admit_children(
            wait, parent=target, turn=turn, actor=actor, key_prefix=f"{target.id}/turn/{turn.id}"
        )
    except DomainError as exc:
        error = {"code": exc.code, "detail": f"cannot dispatch children: {exc.detail}"}
        _end_wait(
            ticket=ticket, target=target, turn=turn, actor=actor, to=TicketState.FAILED, error=error
        )
        return
    lifecycle.append_event(
        ticket_id=target.id,
        kind="waiting_again",
        actor=actor,
        turn_id=turn.id,
        detail={
            "callback": str(ticket.id),
            "children": children,
            "continuation": wait.continuation,
        },
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
