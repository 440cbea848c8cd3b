"""The turns worker's shutdown (docs/explanation/design.md, "Worker shutdown").

On SIGTERM (or the first Ctrl-C) Celery's main process stops taking messages
and waits for its pool. The pool processes hear the shutdown too: from a
process-group signal (a terminal, ``kill -TERM -<pgid>``) or, for a
pool process that is running a turn, from the main process, which passes the
SIGTERM on to those processes only.

A pool process that is running a turn task requests the interrupt of that
exact turn (reason ``shutdown``: the ticket fails ``interrupted``), raises the
runner's flag, and waits for the turn to end -- the cooperative return, or
for a process-isolated turn the escalation (SIGTERM, ``kill_after_s``,
SIGKILL) with the ``waitpid`` status as evidence. The task then returns and
the process goes back to its pool, which ends it in billiard's own way (the
sentinel of the warm shutdown). A turn it cannot stop within its stop window
(an inline callable that ignores the flag) is left ``interrupting`` for the
budget sweep to quarantine, and the pool process exits.

An idle pool process is left to billiard: its own SIGTERM handler raises
``SystemExit``, which releases the pool's queue lock on the way out. (Exiting
with the default action instead dies holding that lock -- an idle process
waits for its next job inside it -- and the main process's pool finalizer
then waits for the lock forever.)

Connected from ``runtime.tasks`` (loaded by every worker)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time

from celery import signals
from celery.worker.control import control_command
from django.db import connection

from core import logs
from core.transient import is_transient, warn_transient

from . import isolation, registry, runas, runners, turns

log = logging.getLogger(__name__)

# In a pool process: set once its shutdown stop has begun.
SHUTDOWN = threading.Event()
# In a pool process: set while it runs a ``run_ticket`` task (task_prerun to
# task_postrun), so that a SIGTERM before its turn has started, or while the
# turn finishes, is not taken for an idle process's.
IN_TURN_TASK = threading.Event()
# After the longest stop window of its turns, a pool process gives up.
GIVE_UP_MARGIN_S = 1.0
# How long a pool process that heard the shutdown waits for the turn of the
# task it runs to start (the task is before ``start_turn``) before it gives up.
START_WAIT_S = 5.0
# The SIGTERM handler ours replaced in this pool process (billiard's).
_pool_handler: list = [None]


def _pool_children() -> list[int]:
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me:
            pids.append(int(entry))
    return pids


@signals.worker_shutting_down.connect
def _pass_shutdown_to_turns(sig=None, how=None, exitcode=None, **kwargs) -> None:
    """In the main process: a pool process that is running a turn hears the
    shutdown too (a warm shutdown alone would wait for turns that may never
    end). Only those: an idle pool process is ended by billiard's own
    shutdown (the sentinel), and a signal now would only race it."""
    from celery.worker import state

    from core.dispatch import RUN_TICKET

    busy = {
        r.worker_pid for r in list(state.active_requests) if r.name == RUN_TICKET and r.worker_pid
    }
    for pid in busy & set(_pool_children()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


@signals.worker_init.connect
def _check_runner_user(sender=None, **kwargs) -> None:
    """In a turns worker's main process, before it forks its pool: a
    ``RUNNER_USER`` it cannot run turns as stops it here, saying why, rather
    than at each turn (runas.py)."""
    app = getattr(sender, "app", None)
    consumed = app.amqp.queues.consume_from if app is not None else None
    if consumed is not None and "turns" not in consumed:
        return  # runs no turns: a control worker
    try:
        runas.check_at_start()
    except runas.Unavailable as exc:
        log.critical("%s", exc)
        raise SystemExit(f"claimcheck: {exc}") from None


@signals.worker_init.connect
def _preload_agents(sender=None, **kwargs) -> None:
    """In the main process, before it forks its pool: import and warm the
    agent frameworks named in ``AGENT_PRELOAD``, so no pool process pays
    for it inside an agent turn's budget (seconds on a loaded host)."""
    from django.conf import settings

    from .agents.runner import preload

    for framework in settings.AGENT_PRELOAD:
        began = time.monotonic()
        preload({"framework": framework})
        log.info("agent framework %s preloaded in %.2fs", framework, time.monotonic() - began)


@signals.worker_ready.connect
def _register(sender=None, **kwargs) -> None:
    """In the main process: register this worker and heartbeat it."""
    from django.conf import settings

    name = sender.hostname
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values())
    pool_size = int(getattr(sender.controller, "concurrency", 0) or 0)
    try:
        registry.register_worker(
            name=name,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=queues,
            pool_size=pool_size,
        )
    except Exception:
        log.exception("worker %s not registered", name)
    finally:
        connection.close()

    def consuming() -> list[str] | None:
        # What the consumer takes messages from now: staff may have cancelled
        # a queue (services.set_worker_consuming). None while it reconnects.
        task_consumer = getattr(sender, "task_consumer", None)
        if task_consumer is None:
            return None
        return [q.name for q in list(task_consumer.queues)]

    def pool_pids() -> list[int] | None:
        # The pool's processes, as the prefork pool lists them (None for a
        # pool without processes of its own: solo, threads).
        pool = getattr(getattr(sender, "pool", None), "_pool", None)
        processes = getattr(pool, "_pool", None)
        if processes is None:
            return None
        return [p.pid for p in list(processes) if p.pid]

    def sync_slots() -> None:
        pids = pool_pids()
        if pids is not None and "turns" in queues:  # a control worker runs no turns
            registry.sync_slots(name, pids)

    try:
        sync_slots()
    except Exception:
        log.warning("slots of worker %s not recorded", name, exc_info=True)
    finally:
        connection.close()

    def beat() -> None:
        while not SHUTDOWN.wait(settings.WORKER_HEARTBEAT_S):
            try:
                registry.beat_worker(name, consuming())
                sync_slots()
            except Exception as exc:  # a database outage: the next beat retries
                if is_transient(exc):
                    warn_transient(log, f"worker heartbeat of {name} failed", exc)
                else:
                    log.warning("worker heartbeat of %s failed", name, exc_info=True)
                connection.close()

    threading.Thread(target=beat, name="worker-heartbeat", daemon=True).start()


@signals.task_prerun.connect
def _install_pool_handler(sender=None, **kwargs) -> None:
    """In a pool process, before each task: the worker's name for the slot
    records, and the SIGTERM handler (billiard installs its own after
    ``worker_process_init``, so it is done here; ours hands an idle process
    back to billiard's)."""
    from core.dispatch import RUN_TICKET

    request = getattr(sender, "request", None)
    registry.set_node(getattr(request, "hostname", "") or "")
    if getattr(sender, "name", None) == RUN_TICKET:
        IN_TURN_TASK.set()
        registry.slot_seen()
    current = signal.getsignal(signal.SIGTERM)
    if current is not _on_sigterm:
        # ValueError: not the main thread (a thread pool): leave it.
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, _on_sigterm)
            _pool_handler[0] = current


@signals.task_postrun.connect
def _turn_task_done(sender=None, **kwargs) -> None:
    IN_TURN_TASK.clear()
    if SHUTDOWN.is_set():
        return
    # Off any turn's budget: the warm turn process of this slot, when the
    # last turn retired it (runtime/isolation.py).
    try:
        isolation.replenish()
    except Exception:  # the next isolated turn forks its own
        log.exception("no warm turn process forked ahead")


def _busy() -> bool:
    return IN_TURN_TASK.is_set() or bool(turns.current_turns())


def _on_sigterm(signum, frame) -> None:
    if not _busy():
        # Idle: billiard's handler (SystemExit, so the pool's queue lock this
        # process waits in is released on the way out).
        _exit_as_billiard(signum, frame)
        return
    if SHUTDOWN.is_set():  # the group's signal and the main's: one stop
        return
    SHUTDOWN.set()
    # Database work happens on a thread of its own (its own connection), never
    # inside the signal handler on the turn's thread.
    threading.Thread(target=stop_running_turns, name="shutdown", daemon=True).start()


def _exit_as_billiard(signum, frame) -> None:
    previous = _pool_handler[0]
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # Never the default action: it would die inside the queue lock.
    raise SystemExit(-(256 - signum))


def stop_running_turns(exit_after: bool = True) -> list:
    """Interrupt this process's turns and wait for its turn task to end (the
    process then goes back to its pool, which ends it). A turn that starts
    meanwhile is interrupted too. If a turn does not end within its stop
    window, or none starts within ``START_WAIT_S``, exit the process."""
    deadline = time.monotonic() + START_WAIT_S
    asked: set = set()
    while True:
        running = turns.current_turns()
        for turn, interrupt in running:
            if turn.id in asked:
                continue
            asked.add(turn.id)
            ep = turn.endpoint
            window = runners.stop_window_s(ep.runner, ep.heartbeat_timeout_s, ep.interrupt_grace_s)
            deadline = max(deadline, time.monotonic() + window + GIVE_UP_MARGIN_S)
            try:
                turns.request_interrupt(turn_id=turn.id, reason="shutdown", actor="worker:shutdown")
            except Exception:  # the flag below still stops a cooperative turn
                log.exception("shutdown: interrupt request for turn %s failed", turn.id)
            finally:
                connection.close()
            interrupt.set()
            log.warning("shutdown: interrupting turn %s seq %s", turn.id, turn.seq)
        if not running and not IN_TURN_TASK.is_set():
            return []
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    left = turns.current_turns()
    if exit_after:
        if left:
            log.error(
                "shutdown: turn(s) %s did not stop; leaving them to the budget sweep",
                ", ".join(str(t.id) for t, _ in left),
            )
        else:
            log.error("shutdown: the turn task did not end; leaving it to the sweeps")
        os._exit(1)
    return left


@control_command(
    name=registry.STOP_COMMAND,
    args=[("stop_id", str), ("turn_id", str), ("pid", int), ("host", str), ("decision", str)],
)
def stop_process(
    state, stop_id: str, turn_id: str, pid: int, host: str, decision: str = ""
) -> dict:
    """An owner's "stop the process", in the main process of the worker it
    names: only on the recorded host, only a pool process of this worker, and
    only while its slot still names that exact turn. The kill and the report
    run on a thread of their own (database work off the control loop)."""
    node = state.consumer.hostname
    refused = None
    if host != socket.gethostname():
        refused = f"{node} runs on {socket.gethostname()}, not on {host}"
    elif pid not in _pool_children():
        refused = f"process {pid} is not a pool process of {node}"
    if refused is not None:
        threading.Thread(
            target=_resolve, args=(stop_id, "refused", refused), name="stop-process", daemon=True
        ).start()
        return {"error": refused}
    threading.Thread(
        target=_kill_slot,
        args=(node, stop_id, turn_id, pid, decision),
        name="stop-process",
        daemon=True,
    ).start()
    return {"ok": f"stopping process {pid}"}


def _kill_slot(node: str, stop_id: str, turn_id: str, pid: int, decision: str = "") -> None:
    from .ports import case_keeper
    from .selectors import slot_runs

    try:
        if not slot_runs(node, pid, turn_id):
            _resolve(stop_id, "gone", f"process {pid} no longer runs turn {turn_id}")
            return
        because = (
            f"pool process {pid} (turn {turn_id}) stopped on an owner's request "
            f"(stop {stop_id}, decision {decision or 'unknown'})"
        )
        log.warning("%s", because)
        logs.expect_exit(pid, because)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid in _pool_children() and not _zombie(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = pid not in _pool_children() or _zombie(pid)
        if not gone:  # stuck in the kernel: the slot stays held, and says so
            _resolve(stop_id, "unreachable", f"process {pid} still exists 10 s after SIGKILL")
            return
        registry.clear_slot(node, pid)
        case_keeper().record_process_exit(
            stop_id=stop_id,
            outcome="killed",
            exit={"pid": pid, "signal": "SIGKILL", "gone": True, "worker": node},
        )
    except Exception:
        log.exception("stop of process %s failed", pid)
    finally:
        connection.close()


def _resolve(stop_id: str, outcome: str, reason: str) -> None:
    """A stop this worker will not carry out, closed with the reason (off
    the control loop: database work)."""
    from .ports import case_keeper

    try:
        case_keeper().resolve_process_stop(
            stop_id=stop_id, outcome=outcome, reason=reason, actor="worker"
        )
    except Exception:  # the budget sweep closes it later
        log.exception("stop %s not resolved (%s)", stop_id, reason)
    finally:
        connection.close()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
