"""Running a ticket in the worker: start the turn, run the runner with
the heartbeat thread and the endpoint's history, finish the turn; start and
finish wait out a database outage."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models import F, Q

from core.errors import DomainError
from core.transient import (
    is_transient,
    retry_transient,
)
from endpoints import runner_spec
from tickets.models import WAIT_EVENT_KINDS, ContextEntry, Ticket, TicketEvent, TicketState, Turn
from tickets.turns.start import Started, start_turn, started_by

from .. import registry, runners, running
from ..runners import Outcome, TurnContext
from .budgets import WORKER_ACTOR, BudgetWatch, interrupt_trace
from .finish import Finished, finish_turn
from .heartbeats import Heartbeater
from .held import held
from .quarantine import quarantine_side_effect_in_doubt
from .receipts import MAX_OPEN_CALLS, keys_in_doubt, open_side_effect_calls, record_turn_event

log = logging.getLogger(__name__)


HISTORY_ENTRIES = 20


def history_entries(runner: dict[str, Any]) -> int:
    """How many recent context entries a turn's runner gets: ``HISTORY_ENTRIES``,
    and for an agent ``AGENT_HISTORY_MAX_ENTRIES`` (its adapter then keeps
    whole exchanges within its message and byte caps: runtime/agents/memory.py)."""
    if runner.get("kind") == "agent":
        return settings.AGENT_HISTORY_MAX_ENTRIES
    return HISTORY_ENTRIES


def run_ticket(
    *,
    ticket_id: uuid.UUID,
    celery_task_id: str = "",
    keep_going: Callable[[], bool] | None = None,
) -> uuid.UUID | None:
    """What the worker does with a dispatch message: start the turn, run the
    runner outside any transaction while heartbeating, finish the turn. Start
    and finish wait out a database outage (``start_with_retry``,
    ``finish_with_retry``); the heartbeat goes on until the finish is in.
    Returns the first turn's id (None: no turn started).

    With ``keep_going`` (the worker's task passes "not shutting down") and a
    ``celery_task_id``, a
    finish that frees the endpoint for its next queued ticket starts that
    ticket's turn in its own transaction (``finish_turn`` with
    ``start_next``), and this process runs it at once: per ticket of a
    backlog, one commit and one broker round trip (publish, deliver,
    acknowledge) less. It goes on while ``keep_going()`` holds, for at most
    ``TURN_CHAIN_MAX`` turns and ``TURN_CHAIN_WINDOW_S`` seconds since the
    first start (other endpoints' messages wait for a free pool process
    meanwhile), asked before each finish; a finish past them publishes the
    next ticket for any free process. Each turn is its own turn (own seq,
    lock tenure, heartbeat, budget and outcome)."""
    first: uuid.UUID | None = None
    began = time.monotonic()
    turns = 0

    def chain() -> bool:
        # The task id is what finds the started turn again when the finish's
        # reply is lost (``finish_turn``, a duplicate).
        return (
            keep_going is not None
            and bool(celery_task_id)
            and turns < settings.TURN_CHAIN_MAX
            and time.monotonic() - began < settings.TURN_CHAIN_WINDOW_S
            and keep_going()
        )

    started: Started | None = None
    while True:
        turns += 1
        turn_id, started = _run_one(
            ticket_id=ticket_id, celery_task_id=celery_task_id, started=started, chain=chain
        )
        first = first or turn_id
        if started is None:
            return first


def _run_one(
    *,
    ticket_id: uuid.UUID,
    celery_task_id: str,
    started: Started | None,
    chain: Callable[[], bool],
) -> tuple[uuid.UUID | None, Started | None]:
    """One turn, the one a finish ``started`` already or else the one the
    message's start starts: (its id or None when none started, the next
    turn its finish started when ``chain()`` said so)."""
    # A worker's pool process records the turn it runs; the one-statement
    # start and finish record it on the turn themselves (tickets/turns/slots.py).
    slot = registry.current_slot()
    if started is None:
        started = start_with_retry(ticket_id=ticket_id, celery_task_id=celery_task_id, slot=slot)
    if started is None:
        return None, None
    turn, ticket, endpoint = started.turn, started.ticket, started.endpoint
    interrupt = threading.Event()
    interval = runners.heartbeat_interval(endpoint.heartbeat_timeout_s, endpoint.interrupt_grace_s)
    # This process enforces the turn's budget itself (the sweep is the safety
    # net for a worker that is gone): the deadline, timed from now on this
    # host's monotonic clock, raises the flag and the escalation follows.
    watch = BudgetWatch(turn=turn, endpoint=endpoint, interrupt=interrupt)
    beater = Heartbeater(turn, interval, interrupt, watch=watch)
    ctx = TurnContext(
        ticket_id=ticket.id,
        turn_id=turn.id,
        seq=turn.seq,
        endpoint=endpoint.address,
        input=ticket.input,
        # Reads between start and finish wait out an outage like those two:
        # an error here would leave a started turn without an outcome, and
        # the budget sweep would quarantine a healthy endpoint.
        _load_history=lambda: _read_with_retry(
            lambda: recent_history(
                endpoint.id,
                limit=history_entries(endpoint.runner),
                **_memory_party(endpoint.runner, ticket),
            ),
            what=f"history for turn {turn.id}",
        ),
        submitter=ticket.submitted_by_id,
        deadline=turn.deadline_at,
        runner=endpoint.runner,
        interrupt_grace_s=endpoint.interrupt_grace_s,
        _interrupt=interrupt,
        _heartbeat=beater.beat,
        _children_of=lambda parent: _read_with_retry(
            lambda: children_of(endpoint.id, parent), what=f"children for turn {turn.id}"
        ),
        token=started.token,
        generation=turn.generation,
        notes=endpoint.notes,
        _record=lambda event: _record_with_retry(turn, event),
        _ticket_state=lambda other: _read_with_retry(
            lambda: ticket_state(endpoint.id, other), what=f"ticket state for turn {turn.id}"
        ),
        _continuation_of=lambda other: _read_with_retry(
            lambda: waiting_on(endpoint.id, other), what=f"continuation for turn {turn.id}"
        ),
        keys_in_doubt=_read_with_retry(
            lambda: keys_in_doubt(ticket=ticket, runner=endpoint.runner),
            what=f"keys in doubt for turn {turn.id}",
        ),
    )
    log.info(
        "turn %s seq %s started for ticket %s on %s", turn.id, turn.seq, ticket.id, endpoint.address
    )
    beater.start()
    with _current_lock:
        _current[turn.id] = (turn, interrupt)
    if not started.slot_recorded:
        registry.slot_busy(turn.id)
    idle_recorded = False
    try:
        outcome = running.run(ctx)
        # The run time on this process's monotonic clock, from before the
        # start statement: finish_turn places the return on the database's
        # clock with it (a late result that returned before its interrupt
        # is kept).
        ran_s = time.monotonic() - started.began
        watch.runner_returned()
        if outcome.kind == "deferred":
            # The agent answers (and is stopped) through the API: its budget
            # is the sweep's.
            log.info("turn %s deferred: the agent answers through the API", turn.id)
            return turn.id, None
        if outcome.kind == "unproven":
            # Nothing proves the turn stopped: no finish; quarantined here
            # (the sweep would, later).
            log.error("turn %s: no stop evidence (%s)", turn.id, outcome.evidence)
            watch.quarantine_unproven()
            return turn.id, None
        if _ended_unreported(outcome) and _side_effect_in_doubt(turn, endpoint.runner, outcome):
            # The process is gone, but whether its open calls took effect is
            # not known: an owner's case, never a failure anyone may retry.
            return turn.id, None
        if outcome.kind == "stopped":
            # Stopped by the flag this worker raised: the interrupt is in the
            # ledger before the finish, which then records why (timed out).
            watch.record_interrupt()
        try:
            finished = finish_with_retry(
                turn=turn,
                outcome=outcome,
                slot=slot,
                start_next=chain(),
                celery_task_id=celery_task_id,
                ran_s=ran_s,
            )
        except Exception as exc:
            finished = _finish_after_fault(turn=turn, exc=exc, slot=slot, ran_s=ran_s)
        idle_recorded = finished.slot_recorded
    finally:
        with _current_lock:
            _current.pop(turn.id, None)
        if not idle_recorded:
            registry.slot_idle()
        beater.stop()
    return turn.id, finished.started


def _ended_unreported(outcome: Outcome) -> bool:
    """The turn's process ended without reporting how its work ended: it
    died (``runner_died``) or the escalation killed it (``process_exit``)."""
    if outcome.kind == "failure":
        return isinstance(outcome.error, dict) and outcome.error.get("code") == "runner_died"
    return outcome.kind == "stopped" and (outcome.evidence or {}).get("kind") == "process_exit"


def _side_effect_in_doubt(turn: Turn, runner: dict[str, Any], outcome: Outcome) -> bool:
    """True when the turn's side-effecting tool calls without an end made
    it a recovery case (``quarantine_side_effect_in_doubt``); False when
    there were none (the outcome is finished as it is) or another process
    ended the turn first."""
    calls = _read_with_retry(
        lambda: open_side_effect_calls(ticket_id=turn.ticket_id, turn_id=turn.id, runner=runner),
        what=f"open tool calls of turn {turn.id}",
    )
    if not calls:
        return False
    # How the process ended (pid, signal or exit code, a crash's bounded
    # traceback): the turn_uncertain event keeps it for the owner.
    exit_ = dict(outcome.error if outcome.kind == "failure" else outcome.evidence["detail"])
    case = retry_transient(
        lambda: quarantine_side_effect_in_doubt(
            turn_id=turn.id,
            seq=turn.seq,
            open_calls=calls[:MAX_OPEN_CALLS],
            exit=exit_,
            actor=WORKER_ACTOR,
        ),
        what=f"quarantine of turn {turn.id}",
        max_s=settings.FINISH_RETRY_MAX_S,
    )
    return case is not None


# The turns this process runs right now, with their interrupt flags: the
# worker's shutdown interrupts them (runtime.worker).
_current: dict[uuid.UUID, tuple[Turn, threading.Event]] = {}
_current_lock = threading.Lock()


def current_turns() -> list[tuple[Turn, threading.Event]]:
    with _current_lock:
        return list(_current.values())


def _memory_party(runner: dict[str, Any], ticket: Ticket) -> dict[str, Any]:
    """How an agent's turn reads its history: each entry with its ticket's
    submitter (whose exchange it is: runtime/agents/memory.py), and for a
    per-submitter memory and a submitter's own ticket only that submitter's
    entries and the runtime's (a resume's callback has no submitter), so
    others' exchanges do not crowd the window out. {} for other runners."""
    mode = runner_spec.memory_mode(runner)
    if mode is None:
        return {}
    if mode == "shared" or ticket.submitted_by_id is None:
        return {"with_submitter": True}
    return {"with_submitter": True, "party": ticket.submitted_by_id}


def recent_history(
    endpoint_id: int,
    *,
    limit: int = HISTORY_ENTRIES,
    with_submitter: bool = False,
    party: int | None = None,
) -> list[dict[str, Any]]:
    rows = ContextEntry.objects.filter(endpoint_id=endpoint_id)
    if with_submitter:
        rows = rows.annotate(submitter=F("ticket__submitted_by_id"))
    if party is not None:
        rows = rows.filter(Q(ticket__submitted_by_id=party) | Q(ticket__submitted_by__isnull=True))
    return [
        {
            "seq": e.seq,
            "ticket": str(e.ticket_id),
            "input": e.input,
            "result": e.result,
            "artifacts": e.artifacts or [],
            **({"submitter": e.submitter} if with_submitter else {}),
        }
        for e in reversed(rows.order_by("-seq")[:limit])
    ]


def ticket_state(endpoint_id: int, ticket_id: str) -> str | None:
    """The state of one of this endpoint's own tickets (None for any other)."""
    try:
        ticket_uuid = uuid.UUID(str(ticket_id))
    except ValueError:
        return None
    return (
        Ticket.objects.filter(id=ticket_uuid, endpoint_id=endpoint_id)
        .values_list("state", flat=True)
        .first()
    )


def waiting_on(endpoint_id: int, ticket_id: str) -> dict[str, Any] | None:
    """The agent continuation one of this endpoint's waiting tickets waits on
    now: its last wait's (``waiting_for_children``, or ``waiting_again`` when
    a resumed agent started another round). None for any other ticket."""
    try:
        ticket_uuid = uuid.UUID(str(ticket_id))
    except ValueError:
        return None
    if not Ticket.objects.filter(
        id=ticket_uuid, endpoint_id=endpoint_id, state=TicketState.WAITING
    ).exists():
        return None
    detail = (
        TicketEvent.objects.filter(ticket_id=ticket_uuid, kind__in=WAIT_EVENT_KINDS)
        .order_by("-id")
        .values_list("detail", flat=True)
        .first()
    )
    agent = ((detail or {}).get("continuation") or {}).get("agent")
    return agent if isinstance(agent, dict) else None


def _record_with_retry(turn: Turn, event: dict[str, Any]) -> bool:
    """A turn event (tool receipt, usage) written now, through a database
    outage; one that still cannot be written is logged and the turn goes on
    (the runner is told: False)."""
    try:
        return _read_with_retry(
            lambda: record_turn_event(turn=turn, event=event, exhausted=interrupt_trace),
            what=f"event of turn {turn.id}",
        )
    except Exception:
        log.exception("turn %s: event %s not recorded", turn.id, event.get("kind"))
        return False


def children_of(endpoint_id: int, parent_id: str) -> list[dict[str, Any]]:
    try:
        parent_uuid = uuid.UUID(str(parent_id))
    except ValueError:
        return []
    # Only this endpoint's own tickets: a runner reads its own work, nobody else's.
    rows = Ticket.objects.filter(
        parent_id=parent_uuid, parent__endpoint_id=endpoint_id, callback_for__isnull=True
    )
    children = []
    for child in rows.order_by("id"):
        # A child superseded by an owner's re-run answers through the re-run
        # (DESIGN.md flow 7): show the latest re-run's state and result.
        answer = child
        while answer.state == TicketState.ORPHANED and (
            rerun := Ticket.objects.filter(rerun_of_id=answer.id).order_by("-id").first()
        ):
            answer = rerun
        entry = {
            "id": str(child.id),
            "dedupe_key": child.dedupe_key,
            "input": child.input,
            # Admitted by the runtime (children, approvals), not by a user.
            "runtime": child.submitted_by_id is None,
            "state": answer.state,
            "result": answer.result,
            "error": answer.error,
        }
        if answer.id != child.id:
            entry["answered_by"] = str(answer.id)
        children.append(entry)
    return children


def _read_with_retry(read, *, what: str):
    """A read the turn needs while it runs, through a database outage (the
    heartbeat thread keeps the turn alive meanwhile)."""
    return retry_transient(read, what=what, max_s=settings.FINISH_RETRY_MAX_S)


def start_with_retry(
    *, ticket_id: uuid.UUID, celery_task_id: str, slot: tuple[str, int] | None = None
) -> Started | None:
    """``start_turn`` through a database outage. The broker message is used up
    (early acknowledgement), so giving up early would leave the ticket to the
    lost-dispatch sweep; retrying costs only latency.

    A start whose COMMIT went through but whose reply was lost has made a
    running turn that only this worker knows about: left alone it would never
    heartbeat and its endpoint would be quarantined. So a retry first looks
    for a running turn started by this very message (its Celery task id,
    this worker process) and, if there is one, runs it."""
    attempts = 0
    # Before any attempt: a turn an earlier attempt committed started after it.
    first = time.monotonic()

    def attempt() -> Started | None:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and celery_task_id:
            mine = started_by(celery_task_id)
            if mine is not None:
                mine.began = first
                log.warning(
                    "turn %s seq %s was started by an attempt whose reply was lost; running it",
                    mine.turn.id,
                    mine.turn.seq,
                )
                return mine
        return start_turn(ticket_id=ticket_id, celery_task_id=celery_task_id, slot=slot)

    return retry_transient(
        attempt, what=f"start for ticket {ticket_id}", max_s=settings.FINISH_RETRY_MAX_S
    )


def _finish_after_fault(
    *, turn: Turn, exc: Exception, slot: tuple[str, int] | None, ran_s: float | None
) -> Finished:
    """The runner returned, and finishing its turn raised in the worker's own
    code (an outcome json or PostgreSQL refused that ``runners.storable``
    did not foresee, a bug): the turn fails ``runtime_error`` with the
    exception's class, through the same finish, so it ends recorded and the
    endpoint serves on. Nothing of the failed attempt was written (the
    finish is one transaction). Raised again: a database still away past
    the retries and a domain error (the turn is not this worker's to
    finish), both the sweep's, and a second failure."""
    if is_transient(exc) or isinstance(exc, DomainError):
        raise exc
    log.exception("turn %s: finishing it failed; it fails runtime_error", turn.id)
    return finish_with_retry(
        turn=turn, outcome=runners.runtime_error(exc, "finishing the turn"), slot=slot, ran_s=ran_s
    )


def finish_with_retry(
    *,
    turn: Turn,
    outcome: Outcome,
    slot: tuple[str, int] | None = None,
    start_next: bool = False,
    celery_task_id: str = "",
    ran_s: float | None = None,
) -> Finished:
    """``finish_turn`` for an outcome this worker knows, through a database
    outage: retried with backoff for up to ``FINISH_RETRY_MAX_S`` while the
    heartbeat goes on. Exactly once: when an attempt committed but lost its
    reply, the retry finds this turn already ended with this same outcome
    (``outcome_sha256`` on its terminal event) and records nothing again.
    Domain errors are not retried. After the last attempt fails the turn is
    left to the budget sweep (fail closed: quarantine). Meanwhile the sweep
    knows this worker holds the outcome (``held``: no quarantine while it
    retries)."""
    with held(turn.id, turn.seq, outcome.kind, ran_s):
        return retry_transient(
            lambda: finish_turn(
                turn_id=turn.id,
                seq=turn.seq,
                outcome=outcome,
                source="worker",
                turn=turn,
                slot=slot,
                start_next=start_next,
                celery_task_id=celery_task_id,
                ran_s=ran_s,
            ),
            what=f"finish of turn {turn.id} seq {turn.seq}",
            max_s=settings.FINISH_RETRY_MAX_S,
        )
