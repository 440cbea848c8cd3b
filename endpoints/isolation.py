"""Process isolation of a ``python`` runner's turn (docs/design.md, "Turn
isolation").

The supervising worker forks one child per turn. The child only runs the
callable and sends its outcome back through a pipe; everything that touches
the database (start, heartbeat, ``children_of``, finish) stays in the
supervisor, which answers the child's ``heartbeat()``, ``children_of()``,
``ticket_state()``, ``continuation()`` and ``record()`` (a turn event written now) over the same
pipe. The interrupt flag is a shared event the supervisor sets
when its heartbeat sees the turn asked to stop.

The escalation, when the turn is interrupted: the cooperative flag, then
``interrupt_grace_s`` for the callable to return, then SIGTERM, then
``kill_after_s``, then SIGKILL. The ``waitpid`` status of *that* child is the
stop evidence (``process_exit``). A child that survives SIGKILL (an
uninterruptible sleep) gives no evidence: the supervisor stops waiting and the
budget sweep quarantines the turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from .runners import Outcome, TurnContext

log = logging.getLogger(__name__)

# How long the supervisor waits for ``waitpid`` after SIGKILL before it gives
# up (the process survives SIGKILL: no proof, the sweep quarantines).
REAP_AFTER_KILL_S = 2.0

# The turns this process supervises right now (turn id -> child); the worker's
# shutdown interrupts them (endpoints.worker).
_running: dict[str, IsolatedTurn] = {}
_running_lock = threading.Lock()


def running_turns() -> list[IsolatedTurn]:
    with _running_lock:
        return list(_running.values())


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when its supervisor dies, so a
    SIGKILLed worker leaves no orphan running the callable."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _ChildChannel:
    """The child's side of the pipe: one request at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def ask(self, *request: Any) -> Any:
        with self.lock:
            self.conn.send(request)
            return self.conn.recv()


def _child_main(ctx: TurnContext, conn: Connection, interrupt: Any, run) -> None:
    """In the forked child: never returns (``os._exit``)."""
    code = 0
    try:
        os.setsid()  # signals to the worker's group go through the supervisor
        _die_with_parent()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        # The inherited database connections belong to the supervisor: drop
        # them unclosed, so nothing here speaks on the supervisor's sockets.
        from django.db import connections

        for c in connections.all(initialized_only=True):
            c.connection = None
        channel = _ChildChannel(conn)
        child_ctx = dataclasses.replace(
            ctx,
            _interrupt=interrupt,
            _heartbeat=lambda: bool(channel.ask("heartbeat")),
            _children_of=lambda parent: channel.ask("children_of", parent),
            _ticket_state=lambda ticket: channel.ask("ticket_state", ticket),
            _continuation_of=lambda ticket: channel.ask("continuation_of", ticket),
            _record=lambda event: channel.ask("record", event),
        )
        outcome = run(child_ctx)
        try:
            with channel.lock:
                conn.send(("outcome", outcome))
        except Exception as exc:  # an unpicklable result
            with channel.lock:
                conn.send(
                    (
                        "outcome",
                        Outcome.failure(
                            {
                                "code": "runner_error",
                                "detail": f"the result cannot be sent back: {exc}",
                            }
                        ),
                    )
                )
    except BaseException:  # noqa: BLE001 - the child must always exit
        code = 70
    finally:
        os._exit(code)


def _describe_status(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return {"returncode": -sig, "signal": name}
    return {"returncode": os.WEXITSTATUS(status), "signal": None}


@dataclasses.dataclass
class IsolatedTurn:
    """One forked turn under supervision."""

    pid: int
    turn_id: str
    conn: Connection
    child_interrupt: Any
    grace_s: float
    kill_after_s: float
    interrupted_at: float | None = None
    signals_sent: list[str] = dataclasses.field(default_factory=list)
    sigterm_at: float | None = None
    sigkill_at: float | None = None
    status: int | None = None
    # Set by the worker's shutdown: stop now, do not wait for the next beat.
    shutdown: threading.Event = dataclasses.field(default_factory=threading.Event)

    def reap(self) -> bool:
        if self.status is not None:
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: no status to show
            self.status = -1
            return True
        if pid == 0:
            return False
        self.status = status
        return True

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        self.signals_sent.append(sig.name)

    def escalate(self, now: float) -> bool:
        """One step of the escalation; False when the supervisor gives up
        (the child survived SIGKILL)."""
        if self.interrupted_at is None:
            self.interrupted_at = now
            self.child_interrupt.set()
        if self.sigterm_at is None and now >= self.interrupted_at + self.grace_s:
            self.sigterm_at = now
            self.signal(signal.SIGTERM)
        elif (
            self.sigterm_at is not None
            and self.sigkill_at is None
            and now >= self.sigterm_at + self.kill_after_s
        ):
            self.sigkill_at = now
            self.signal(signal.SIGKILL)
        elif self.sigkill_at is not None and now >= self.sigkill_at + REAP_AFTER_KILL_S:
            return False
        return True

    def evidence(self) -> dict[str, Any]:
        detail: dict[str, Any] = {"pid": self.pid, "isolation": "process"}
        if self.status is not None and self.status >= 0:
            detail.update(_describe_status(self.status))
        detail["signals_sent"] = list(self.signals_sent)
        return detail


def run_isolated(ctx: TurnContext, run, *, kill_after_s: float) -> Outcome:
    """Fork a child that runs ``run(ctx)``; supervise it until it returns,
    dies, or the escalation ends it. ``ctx._interrupt`` is the supervisor's
    flag (raised by its heartbeat thread)."""
    mp = multiprocessing.get_context("fork")
    parent_conn, child_conn = mp.Pipe(duplex=True)
    child_interrupt = mp.Event()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        parent_conn.close()
        _child_main(ctx, child_conn, child_interrupt, run)
    child_conn.close()
    turn = IsolatedTurn(
        pid=pid,
        turn_id=str(ctx.turn_id),
        conn=parent_conn,
        child_interrupt=child_interrupt,
        grace_s=ctx.interrupt_grace_s,
        kill_after_s=kill_after_s,
    )
    with _running_lock:
        _running[turn.turn_id] = turn
    log.info("turn %s runs in process %s", ctx.turn_id, pid)
    try:
        return _supervise(ctx, turn)
    finally:
        with _running_lock:
            _running.pop(turn.turn_id, None)
        parent_conn.close()


def _outcome_left_in(conn: Connection) -> Outcome | None:
    """The outcome among the messages an exited child left in the pipe."""
    try:
        while conn.poll(0):
            message = conn.recv()
            if message[0] == "outcome":
                return message[1]
    except (EOFError, OSError):
        pass
    return None


# What the child gets when the supervisor could not answer (a database
# outage past the retries): nothing found, nothing recorded.
_FAILED_ANSWER: dict[str, Any] = {
    "children_of": [],
    "ticket_state": None,
    "continuation_of": None,
    "record": False,
}


def _answer(ctx: TurnContext, verb: str, args: tuple) -> Any:
    if verb == "heartbeat":
        return ctx._heartbeat()
    if verb == "children_of":
        return ctx._children_of(args[0])
    if verb == "ticket_state":
        return ctx._ticket_state(args[0]) if ctx._ticket_state else None
    if verb == "continuation_of":
        return ctx._continuation_of(args[0]) if ctx._continuation_of else None
    if verb == "record":
        return ctx._record(args[0]) if ctx._record else False
    raise ValueError(f"unknown request {verb!r} from a turn's process")


def _supervise(ctx: TurnContext, turn: IsolatedTurn) -> Outcome:
    outcome: Outcome | None = None
    while True:
        try:
            ready = turn.conn.poll(0.05)
        except (EOFError, OSError):
            ready = False
        if ready:
            try:
                message = turn.conn.recv()
            except (EOFError, OSError):
                message = None
            if message is not None:
                verb = message[0]
                if verb == "outcome":
                    outcome = message[1]
                else:
                    try:
                        reply = _answer(ctx, verb, message[1:])
                    except Exception:  # the child must not hang on a failed answer
                        log.exception("turn %s: answering %s failed", ctx.turn_id, verb)
                        reply = _FAILED_ANSWER.get(verb, ctx._interrupt.is_set())
                    with contextlib.suppress(OSError, BrokenPipeError):
                        turn.conn.send(reply)
        if turn.reap():
            # The child may have sent its outcome and exited between the poll
            # above and this reap: what it sent is still in the pipe.
            outcome = outcome or _outcome_left_in(turn.conn)
            break
        if outcome is not None:
            # The child exits right after sending its outcome; wait for it.
            deadline = time.monotonic() + 5
            while not turn.reap() and time.monotonic() < deadline:
                time.sleep(0.01)
            break
        if (ctx._interrupt.is_set() or turn.shutdown.is_set()) and not turn.escalate(
            time.monotonic()
        ):
            log.error(
                "turn %s: process %s survived SIGKILL; no stop evidence (the sweep quarantines)",
                ctx.turn_id,
                turn.pid,
            )
            # No outcome at all: nothing proves this turn stopped.
            return Outcome.unproven({"pid": turn.pid, "signals_sent": turn.signals_sent})
    interrupted = turn.interrupted_at is not None
    if outcome is not None and not turn.signals_sent:
        if outcome.kind == "stopped" and outcome.evidence is not None:
            outcome.evidence["detail"] = {**outcome.evidence.get("detail", {}), **turn.evidence()}
            return outcome
        if interrupted or ctx._interrupt.is_set():
            return Outcome.stopped(
                "runner_returned",
                {"returned": outcome.kind, "after_interrupt": True, **turn.evidence()},
            )
        return outcome
    if interrupted:
        return Outcome.stopped("process_exit", turn.evidence())
    # The child died on its own without an outcome (a crash, os._exit).
    return Outcome.failure(
        {"code": "runner_died", "detail": "the turn's process exited without an outcome"}
        | turn.evidence()
    )
