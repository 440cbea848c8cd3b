"""Process isolation of a ``python`` (or ``agent``) runner's turn
(docs/explanation/design.md, "Turn isolation").

Each worker slot (a pool process, the supervisor) keeps one warm child: a
process it forked ahead, which runs one turn at a time. The supervisor sends
it the turn (the runner's function, the context's plain fields, the log
context) over a pipe; the child runs it and sends the outcome back through
the same pipe, then waits for the next turn. Everything that touches the
database (start, heartbeat, ``children_of``, finish) stays in the
supervisor, which answers the child's ``heartbeat()``, ``history``,
``children_of()``, ``ticket_state()``, ``continuation()`` and ``record()`` (a
turn event written now) over the pipe.
The interrupt flag is a shared event the supervisor sets when its heartbeat
sees the turn asked to stop.

The escalation, when the turn is interrupted: the cooperative flag, then
``interrupt_grace_s`` for the callable to return, then SIGTERM, then
``kill_after_s``, then SIGKILL. The ``waitpid`` status of *that* child is the
stop evidence (``process_exit``); a child that returned after its flag is
told to exit and its exit status joins the ``runner_returned`` evidence. A
child that survives SIGKILL (an uninterruptible sleep) gives no evidence: the
supervisor stops waiting and the turn is quarantined.

A child serves the next turn only when its last one ended plainly: no
interrupt, no signal, an outcome received, and the turn left the process as
it found it (the same environment, so a secret an agent's turn exported is
never the next turn's; the same working directory; no thread of its own
still running). Otherwise it exits (or was killed) and the next turn gets a
fresh child, forked after the task (``replenish``) or at that turn's start.
It is also replaced after ``ISOLATION_RECYCLE_TURNS`` turns, and when it is
found dead between turns (logged). A child serves any runner path: modules
are imported when a turn first needs them and stay imported, as in the
worker itself, so a runner must not rely on its module being fresh.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import io
import logging
import multiprocessing
import os
import re
import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from endpoints import runner_spec

from . import registry, runas
from .runners import (
    Outcome,
    RunnerError,
    TurnContext,
    carried_history,
    runtime_error,
    storable,
)

log = logging.getLogger(__name__)

# How long the supervisor waits for ``waitpid`` after SIGKILL before it gives
# up (the process survives SIGKILL: no proof, the sweep quarantines).
REAP_AFTER_KILL_S = 2.0
# How long a child told to exit (after an interrupted turn) has to do so.
EXIT_WAIT_S = 5.0


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


# --- A child that runs as the runner user -------------------------------------------------
#
# Such a child (runas.py) cannot open the worker's files, so what a turn of
# it needs from them its supervisor hands over: the secrets its runner names
# (with the turn), and the artifacts an agent's memory reads and writes
# (runtime/agents/memory.py), on request over the pipe.

# Only content-addressed names, each body checked against its name: a turn
# can neither overwrite a file nor read one whose digest it does not know.
_ARTIFACT_NAME = re.compile(r"^(?:agents|receipts)/[0-9a-f]{2}/([0-9a-f]{64})\.json$")
# In the child: the channel of the turn it runs now.
_turn_channel: _ChildChannel | None = None


def _named_secrets(runner: dict[str, Any]) -> dict[str, str]:
    """The values of the secrets this runner names that this host holds (a
    name it lacks stays missing in the child, which says so as inline)."""
    from core import secrets

    values = {}
    for name in runner_spec.named_secrets(runner):
        with contextlib.suppress(secrets.SecretMissing):
            values[name] = secrets.secret(name)
    return values


class _SupervisedStorage:
    """``default_storage`` in a child that runs as the runner user: the
    calls an agent's memory makes, answered by the supervisor."""

    def exists(self, name: str) -> bool:
        return bool(self._ask("exists", name))

    def save(self, name: str, content) -> str:
        return self._ask("save", name, content.read())

    def open(self, name: str, mode: str = "rb") -> io.BytesIO:
        return io.BytesIO(self._ask("open", name))

    def _ask(self, op: str, name: str, body: bytes | None = None) -> Any:
        if _turn_channel is None:
            raise OSError("artifacts are reachable during a turn only")
        ok, value = _turn_channel.ask("storage", op, name, body)
        if not ok:
            raise OSError(value)
        return value


def _supervise_storage() -> None:
    from django.core.files.storage import default_storage

    default_storage._wrapped = _SupervisedStorage()


def _storage_answer(op: str, name: str, body: bytes | None) -> tuple[bool, Any]:
    """In the supervisor: one storage request of a child, ``(ok, value)``."""
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    match = _ARTIFACT_NAME.match(str(name))
    if match is None:
        return False, f"not a content-addressed artifact name: {str(name)[:200]!r}"
    try:
        if op == "exists":
            return True, default_storage.exists(name)
        if op == "open":
            with default_storage.open(name, "rb") as fh:
                return True, fh.read()
        if op == "save":
            if not isinstance(body, bytes) or hashlib.sha256(body).hexdigest() != match[1]:
                return False, f"the body of {name} does not match its name"
            return True, default_storage.save(name, ContentFile(body))
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return False, f"unknown storage request {op!r}"


# --- The warm child ---------------------------------------------------------------------

# The fields of a TurnContext that cross the pipe: every plain one (a field
# added to the context reaches an isolated turn as it reaches an inline
# one), and the history rows when the supervisor already has them; the
# other underscored fields are the supervisor's callables, which the child
# replaces with requests.
_CONTEXT_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(TurnContext)
    if not f.name.startswith("_") or f.name == "_history_rows"
)
_TURN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)


@dataclasses.dataclass
class WarmChild:
    """A process forked ahead by this supervisor, waiting for its next turn."""

    pid: int
    conn: Connection
    interrupt: Any  # a multiprocessing event, shared with the child
    # Forked by the process's main thread: kept between turns. A child forked
    # by another thread dies with that thread (PR_SET_PDEATHSIG is per
    # thread), so it serves one turn.
    keep: bool = True
    turns: int = 0
    # The runner user it dropped to (runas.py); None: it runs as the worker.
    user: runas.RunAs | None = None


_idle: list[WarmChild] = []
_idle_lock = threading.Lock()
# Children told to exit, reaped when they have (pid -> when told).
_exiting: dict[int, float] = {}
# This process runs isolated turns: a child it retires is replaced ahead.
_used = False


def _forget_inherited() -> None:
    """In any process forked from this one (a warm child, a pool process):
    the children above are its parent's, not its own."""
    global _idle_lock, _used
    _idle.clear()
    _exiting.clear()
    _idle_lock = threading.Lock()
    _used = False


os.register_at_fork(after_in_child=_forget_inherited)


def _recycle_turns() -> int:
    from django.conf import settings

    return max(1, int(getattr(settings, "ISOLATION_RECYCLE_TURNS", 500)))


def _spawn(user: runas.RunAs | None = None) -> WarmChild:
    mp = multiprocessing.get_context("fork")
    parent_conn, child_conn = mp.Pipe(duplex=True)
    interrupt = mp.Event()
    supervisor = os.getpid()
    keep = threading.current_thread() is threading.main_thread()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        parent_conn.close()
        _child_main(child_conn, interrupt, supervisor, user)
    child_conn.close()
    log.debug("warm turn process %s started", pid)
    registry.slot_child(pid)
    return WarmChild(pid=pid, conn=parent_conn, interrupt=interrupt, keep=keep, user=user)


def _exited(child: WarmChild) -> int | None:
    """The child's wait status if it has exited (reaped now), else None."""
    try:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return status if pid else None


def _take() -> WarmChild:
    """An idle warm child of this process, or a new one. One found dead
    between turns is replaced, with a log line."""
    global _used
    _used = True
    _reap_exiting()
    user = runas.current()
    while True:
        with _idle_lock:
            child = _idle.pop() if _idle else None
        if child is None:
            return _spawn(user)
        status = _exited(child)
        if status is None and child.user != user:  # the setting changed: not this child
            _retire(child)
            continue
        if status is None:
            return child
        with contextlib.suppress(OSError):
            child.conn.close()
        log.warning(
            "warm turn process %s exited between turns (%s); a new one runs the turn",
            child.pid,
            _status_text(status),
        )


def _give_back(child: WarmChild) -> None:
    with _idle_lock:
        if not _idle:
            _idle.append(child)
            return
    _retire(child)  # one idle child per slot is enough


def _retire(child: WarmChild) -> None:
    """Tell a child to exit; it is reaped later (``_reap_exiting``)."""
    with contextlib.suppress(OSError, ValueError):
        child.conn.send(("exit",))
    with contextlib.suppress(OSError):
        child.conn.close()
    _exiting[child.pid] = time.monotonic()


def _reap_exiting() -> None:
    for pid, told in list(_exiting.items()):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _exiting.pop(pid, None)
        elif time.monotonic() - told > EXIT_WAIT_S:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def replenish() -> None:
    """After a task, off any turn's budget: a process that runs isolated
    turns and has no warm child forks one for its next turn."""
    _reap_exiting()
    if not _used or threading.current_thread() is not threading.main_thread():
        return
    with _idle_lock:
        if _idle:
            return
    try:
        child = _spawn(runas.current())
    except runas.Unavailable:  # the next turn forks its own, and fails saying why
        return
    with _idle_lock:
        _idle.append(child)


def retire_idle() -> None:
    """End this process's idle warm children (the next turn forks afresh)."""
    with _idle_lock:
        children = list(_idle)
        _idle.clear()
    for child in children:
        _retire(child)
    deadline = time.monotonic() + EXIT_WAIT_S
    while _exiting and time.monotonic() < deadline:
        _reap_exiting()
        if _exiting:
            time.sleep(0.005)


def _reset_turn_signals() -> None:
    for sig in _TURN_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _child_main(
    conn: Connection, interrupt: Any, supervisor: int, user: runas.RunAs | None = None
) -> None:
    """In the forked child: runs turns until told to exit, or until a turn
    leaves the process changed; never returns (``os._exit``)."""
    code = 0
    try:
        os.setsid()  # signals to the worker's group go through the supervisor
        if user is not None:
            # Before the death signal: a change of user clears it.
            runas.become(user)
            _supervise_storage()
        _die_with_parent()
        if os.getppid() != supervisor:  # the supervisor died before the prctl
            return
        _reset_turn_signals()
        # The inherited database connections belong to the supervisor: drop
        # them unclosed, so nothing here speaks on the supervisor's sockets.
        from django.db import connections

        for c in connections.all(initialized_only=True):
            c.connection = None
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message[0] != "turn":
                return
            _, fields, log_context, run, named = message
            if not _child_turn(conn, interrupt, fields, log_context, run, named):
                return
    except BaseException:  # noqa: BLE001 - the child must always exit
        code = 70
        # Before it exits, the supervisor hears why (its log, the ticket's
        # error): otherwise all anyone sees is "exit code 70".
        with contextlib.suppress(BaseException):
            conn.send(("crashed", _bounded_traceback()))
    finally:
        os._exit(code)


# How much of a crashed turn process's traceback reaches the log and the
# ticket's error: the first line and the innermost frames with the
# exception itself, which is where it ends.
CRASH_TEXT_CHARS = 4000


def _bounded_traceback() -> str:
    import traceback

    text = traceback.format_exc()
    if len(text) <= CRASH_TEXT_CHARS:
        return text
    head, _, _ = text.partition("\n")
    tail = text[-(CRASH_TEXT_CHARS - len(head) - 6) :]
    return f"{head}\n  …\n{tail}"


def _history(channel: _ChildChannel) -> list[dict[str, Any]]:
    rows = channel.ask("history")
    if rows is None:  # as inline: the read's failure reaches the runner
        raise RunnerError("the endpoint's history could not be read")
    return rows


def _child_turn(
    conn: Connection, interrupt: Any, fields: dict, log_context: dict, run, named=None
) -> bool:
    """One turn in the child; True when the process is fit for another.
    ``named``: the secrets of this turn's runner, when the child runs as the
    runner user (it reads no secrets itself)."""
    from core import logs, secrets

    global _turn_channel
    _reset_turn_signals()
    environ, cwd = dict(os.environ), os.getcwd()
    channel = _ChildChannel(conn)
    _turn_channel = channel
    if named is not None:
        secrets.confine(named)
    ctx = TurnContext(
        **fields,
        _interrupt=interrupt,
        _heartbeat=lambda: bool(channel.ask("heartbeat")),
        _children_of=lambda parent: channel.ask("children_of", parent),
        _ticket_state=lambda ticket: channel.ask("ticket_state", ticket),
        _continuation_of=lambda ticket: channel.ask("continuation_of", ticket),
        _record=lambda event: channel.ask("record", event),
        # Read when the runner first asks, as inline: a turn that never looks
        # costs no query.
        _load_history=lambda: _history(channel),
    )
    token = logs._context.set(dict(log_context))
    try:
        outcome = run(ctx)
        # Checked here, before the pipe: what the ledger cannot store (too
        # deep to pickle, among others) comes back as the turn's failure.
        try:
            outcome = storable(outcome)
        except Exception as exc:
            outcome = runtime_error(exc, "checking the runner's outcome")
    finally:
        logs._context.reset(token)
        if named is not None:
            secrets.confine({})
    # A connection the turn opened itself is its own: closed, not kept.
    from django.db import connections

    with contextlib.suppress(Exception):
        connections.close_all()
    fit = os.environ == environ and os.getcwd() == cwd and threading.active_count() == 1
    try:
        with channel.lock:
            conn.send(("outcome", outcome, fit))
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
                    fit,
                )
            )
    return fit


def _status_text(status: int) -> str:
    if status < 0:
        return "status unknown"
    described = _describe_status(status)
    return described["signal"] or f"exit code {described['returncode']}"


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
    """One turn under supervision, in its (warm) child."""

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
    # The child sent its outcome and may serve another turn.
    fit: bool = False
    # The traceback the child sent before it exited on an exception.
    crash: str | None = None
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
    """Run ``run(ctx)`` in this slot's warm child; supervise it until it
    returns, dies, or the escalation ends it. ``ctx._interrupt`` is the
    supervisor's flag (raised by its heartbeat thread). ``run`` is a
    module-level function (it crosses the pipe by name)."""
    from core import logs

    try:
        child = _take()
    except runas.Unavailable as exc:
        return Outcome.failure({"code": "runner_error", "detail": str(exc)})
    fields = {f: getattr(ctx, f) for f in _CONTEXT_FIELDS}
    named = _named_secrets(ctx.runner) if child.user is not None else None
    message = ("turn", fields, logs.current(), run, named)
    try:
        child = _hand_over(child, message)
    except Exception as exc:
        # Nothing of the turn runs (a message that cannot be pickled is not
        # sent at all; a child that got part of one is told to exit): the
        # turn fails, the endpoint serves on.
        log.exception("turn %s could not be handed to its process", ctx.turn_id)
        return runtime_error(exc, "handing the turn to its process")
    turn = IsolatedTurn(
        pid=child.pid,
        turn_id=str(ctx.turn_id),
        conn=child.conn,
        child_interrupt=child.interrupt,
        grace_s=ctx.interrupt_grace_s,
        kill_after_s=kill_after_s,
    )
    log.info("turn %s runs in process %s", ctx.turn_id, child.pid)
    try:
        return _supervise(ctx, turn)
    finally:
        child.turns += 1
        if turn.fit and turn.status is None and child.keep and child.turns < _recycle_turns():
            _give_back(child)
        elif turn.status is None:  # alive (or past SIGKILL): told to exit, reaped later
            _retire(child)
        else:
            with contextlib.suppress(OSError):
                child.conn.close()


def _hand_over(child: WarmChild, message: tuple) -> WarmChild:
    """Send the turn to ``child``, this slot's warm child (a fresh one, as
    the same user, when it died after the check); the child it went to. On
    an error no child runs it: the one that may have got part of the
    message is retired."""
    child.interrupt.clear()
    try:
        child.conn.send(message)
    except OSError:  # it died after the check: a fresh one
        log.warning("warm turn process %s is gone; a new one runs the turn", child.pid)
        _retire(child)
        child = _spawn(child.user)
        child.interrupt.clear()
        try:
            child.conn.send(message)
        except BaseException:
            _retire(child)
            raise
    except BaseException:
        _retire(child)
        raise
    return child


def _outcome_left_in(turn: IsolatedTurn) -> Outcome | None:
    """The outcome among the messages an exited child left in the pipe (and
    the traceback of its crash, kept on ``turn``)."""
    try:
        while turn.conn.poll(0):
            message = turn.conn.recv()
            if message[0] == "outcome":
                return message[1]
            if message[0] == "crashed":
                turn.crash = str(message[1])
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
    "history": None,
    "storage": (False, "the worker could not answer"),
}


def _answer(ctx: TurnContext, verb: str, args: tuple) -> Any:
    if verb == "heartbeat":
        return ctx._heartbeat()
    if verb == "storage":
        return _storage_answer(*args)
    if verb == "children_of":
        return ctx._children_of(args[0])
    if verb == "ticket_state":
        return ctx._ticket_state(args[0]) if ctx._ticket_state else None
    if verb == "continuation_of":
        return ctx._continuation_of(args[0]) if ctx._continuation_of else None
    if verb == "record":
        return ctx._record(args[0]) if ctx._record else False
    if verb == "history":
        return ctx.history
    raise ValueError(f"unknown request {verb!r} from a turn's process")


def _send_answer(conn: Connection, ctx: TurnContext, verb: str, reply: Any) -> None:
    """An answer to the child; one that cannot be pickled (a history row
    nested past what pickle carries, written before the depth bound) is
    sent without what it cannot carry (history), else as a failed answer:
    nothing of it was written, and the child must not wait for it."""
    try:
        conn.send(reply)
        return
    except OSError:
        raise
    except Exception:
        log.exception("turn %s: the answer to %s cannot be sent to its process", ctx.turn_id, verb)
    if verb == "history":
        with contextlib.suppress(OSError, ValueError, TypeError, RecursionError):
            conn.send(carried_history(reply, ForkingPickler.dumps))
            return
    conn.send(_FAILED_ANSWER.get(verb, ctx._interrupt.is_set()))


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
                    turn.fit = len(message) > 2 and bool(message[2])
                elif verb == "crashed":
                    turn.crash = str(message[1])
                else:
                    try:
                        reply = _answer(ctx, verb, message[1:])
                    except Exception:  # the child must not hang on a failed answer
                        log.exception("turn %s: answering %s failed", ctx.turn_id, verb)
                        reply = _FAILED_ANSWER.get(verb, ctx._interrupt.is_set())
                    with contextlib.suppress(OSError, BrokenPipeError):
                        _send_answer(turn.conn, ctx, verb, reply)
        if turn.reap():
            # The child may have sent its outcome and exited between the poll
            # above and this reap: what it sent is still in the pipe.
            outcome = outcome or _outcome_left_in(turn)
            break
        if outcome is not None:
            if not (turn.interrupted_at is not None or ctx._interrupt.is_set()):
                break  # a fit child waits for its next turn; an unfit one exits
            # Interrupted: the child exits now, and its exit status joins the
            # evidence.
            turn.fit = False
            with contextlib.suppress(OSError, ValueError):
                turn.conn.send(("exit",))
            deadline = time.monotonic() + EXIT_WAIT_S
            while not turn.reap() and time.monotonic() < deadline:
                time.sleep(0.005)
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
    error = {"code": "runner_died", "detail": "the turn's process exited without an outcome"}
    if turn.crash:
        crash = _scrubbed(turn.crash, ctx)
        last = crash.rstrip().rpartition("\n")[2]
        error.update(detail=f"the turn's process raised before it could report: {last}")
        error["traceback"] = crash
        log.error(
            "turn %s: process %s raised before it could report:\n%s", ctx.turn_id, turn.pid, crash
        )
    return Outcome.failure(error | turn.evidence())


def _scrubbed(text: str, ctx: TurnContext) -> str:
    """A crash's text without the turn's token or the values of the
    secrets its runner put in the process's environment."""
    from core.secrets import secret

    if ctx.token:
        text = text.replace(ctx.token, "[turn token]")
    for name in (ctx.runner.get("secrets") or {}).values():
        try:
            value = secret(name)
        except Exception:  # noqa: BLE001 - a secret that cannot be read was not exported
            continue
        if value:
            text = text.replace(value, f"[secret {name}]")
    return text
