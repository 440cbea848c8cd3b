"""The worker registry: workers register and heartbeat themselves; each pool
process is a slot (docs/explanation/design.md, "Worker registry").

Writes only: the worker's own row and its slots' rows. Which turn a slot
runs is the ledger's record, on the turn (tickets/turns/slots.py): the
turn's start and finish write it in their own statements; what happens
outside them (a turn let go of without a finish, a pool process gone) is
recorded here through the ledger's service. What the rows mean (idle,
running, interrupting, held, lost) is read by ``runtime.selectors``."""

from __future__ import annotations

import logging
import os
import uuid

from django.db import connection
from django.utils import timezone

from core.transient import TRANSIENT_DB_ERRORS, describe, drop_broken_connection
from tickets.turns import slots

from .models import Worker, WorkerSlot

log = logging.getLogger(__name__)

# The Celery node name of the worker this pool process belongs to (set when a
# task starts, runtime.worker); empty outside a worker: nothing is recorded.
_node = ""


# The slot whose row this process made (node name, pid): slot_seen.
_made: tuple[str, int] = ("", 0)


def set_node(name: str) -> None:
    global _node, _made
    if (name or "") != _node:
        _made = ("", 0)
    _node = name or ""


def slot_seen() -> None:
    """This pool process runs turns for its worker: its slot's row, made at
    its first turn task, so a pool whose processes the worker's main process
    does not list (solo, threads: no sync_slots) has its slots shown too.
    Once per process, not per turn."""
    global _made
    if _node and _made != (_node, os.getpid()):
        _ensure_slot(_node)
        _made = (_node, os.getpid())


def register_worker(
    *,
    name: str,
    host: str,
    pid: int,
    queues: list[str],
    pool_size: int,
    consuming: list[str] | None = None,
) -> Worker:
    now = timezone.now()
    worker, _ = Worker.objects.update_or_create(
        name=name,
        defaults={
            "host": host,
            "pid": pid,
            "queues": queues,
            # A (re)started worker consumes what it was started for.
            "consuming": sorted(queues if consuming is None else consuming),
            "pool_size": pool_size,
            "started_at": now,
            "last_seen_at": now,
        },
    )
    # A restarted worker of the same name: its old pool processes are gone,
    # and so is any turn they still ran.
    gone = WorkerSlot.objects.filter(worker=worker)
    slots.let_go([slots.slot_key(name, pid) for pid in gone.values_list("pid", flat=True)])
    gone.delete()
    return worker


def beat_worker(name: str, consuming: list[str] | None = None) -> None:
    """The worker is alive; ``consuming``: the queues its consumer takes
    messages from now (None: unknown, e.g. while it reconnects; left as is)."""
    fields: dict = {"last_seen_at": timezone.now()}
    if consuming is not None:
        fields["consuming"] = sorted(consuming)
    Worker.objects.filter(name=name).update(**fields)


# The slot's row, once per pool process (its turns are the ledger's record).
_SLOT_SQL = """
INSERT INTO runtime_workerslot (worker_id, pid, since, updated_at)
SELECT w.id, %(pid)s, %(now)s, %(now)s FROM runtime_worker w WHERE w.name = %(node)s
ON CONFLICT (worker_id, pid) DO NOTHING
"""


def _ensure_slot(node: str) -> None:
    try:
        with connection.cursor() as cur:
            cur.execute(_SLOT_SQL, {"pid": os.getpid(), "now": timezone.now(), "node": node})
    except TRANSIENT_DB_ERRORS as exc:  # the registry is a view: never fail a turn for it
        log.warning("worker slot not recorded: %s", describe(exc))
        drop_broken_connection()


_CHILD_SQL = """
UPDATE runtime_workerslot s SET child_pid = %(child)s
FROM runtime_worker w WHERE w.id = s.worker_id AND w.name = %(node)s AND s.pid = %(pid)s
"""


def slot_child(child_pid: int) -> None:
    """This pool process forked ``child_pid`` as its warm turn process
    (runtime/isolation.py): the process its isolated turns run in, shown
    beside the slot. Once per fork, not per turn."""
    if not _node:
        return
    try:
        with connection.cursor() as cur:
            cur.execute(_CHILD_SQL, {"child": child_pid, "node": _node, "pid": os.getpid()})
    except TRANSIENT_DB_ERRORS as exc:  # the registry is a view: never fail a turn for it
        log.warning("worker slot's turn process not recorded: %s", describe(exc))
        drop_broken_connection()
    except Exception:
        log.exception("worker slot's turn process not recorded")


def current_slot() -> tuple[str, int] | None:
    """This pool process's slot (node name, pid), for the turn's start and
    finish functions, which record it themselves; None outside a worker."""
    return (_node, os.getpid()) if _node else None


def slot_busy(turn_id: uuid.UUID) -> None:
    """This pool process now runs ``turn_id`` (a turn whose start did not
    name the slot: one found again after its start's reply was lost)."""
    if not _node:
        return
    try:
        slots.occupy(turn_id, node=_node, pid=os.getpid())
    except TRANSIENT_DB_ERRORS as exc:  # the registry is a view: never fail a turn for it
        log.warning("worker slot not recorded: %s", describe(exc))
        drop_broken_connection()
        return
    _ensure_slot(_node)


def slot_idle() -> None:
    """This pool process runs nothing any more (it returned from the turn
    without a finish of its own: the finish lets go in its statement)."""
    if not _node:
        return
    try:
        slots.let_go([slots.slot_key(_node, os.getpid())])
    except TRANSIENT_DB_ERRORS as exc:  # the registry is a view: never fail a turn for it
        log.warning("worker slot not recorded: %s", describe(exc))
        drop_broken_connection()


STOP_COMMAND = "claimcheck_stop_process"


def request_process_stop(worker: str, **arguments) -> None:
    """Ask the worker named ``worker`` (and only it: the broadcast's
    destination) to kill its own pool process ``pid`` if it still runs
    ``turn_id`` (``runtime.worker``). After commit of the recorded stop."""
    from celery import current_app

    try:
        current_app.control.broadcast(STOP_COMMAND, arguments=arguments, destination=[worker])
    except Exception:  # the broker is down: the stop stays "requested", visible
        log.exception("stop-the-process request to %s not sent", worker)


_SYNC_SQL = """
WITH w AS (SELECT id FROM runtime_worker WHERE name = %(node)s),
gone AS (
  DELETE FROM runtime_workerslot s USING w
  WHERE s.worker_id = w.id AND NOT (s.pid = ANY(%(pids)s))
  RETURNING s.pid
),
made AS (
  INSERT INTO runtime_workerslot (worker_id, pid, since, updated_at)
  SELECT w.id, p, %(now)s, %(now)s FROM w, unnest(%(pids)s::int[]) AS p
  ON CONFLICT (worker_id, pid) DO NOTHING
)
SELECT pid FROM gone
"""


def sync_slots(worker: str, pids: list[int]) -> None:
    """The worker's slots are its pool processes, ``pids``: one row each
    (idle until it runs a turn), none for a process that is gone, and no
    turn run by one that is gone. A pool process makes its own row only at
    its first task, so without this a process the pool started in place of
    one that exited (a "stop the process", a crash, ``max_tasks_per_child``)
    had no row until then, and the exited one kept its row. Run by the
    worker's main process, which starts and reaps them, at its start and on
    every heartbeat."""
    with connection.cursor() as cur:
        cur.execute(_SYNC_SQL, {"node": worker, "pids": sorted(pids), "now": timezone.now()})
        gone = [row[0] for row in cur.fetchall()]
    slots.let_go([slots.slot_key(worker, pid) for pid in gone])


def clear_slot(worker: str, pid: int) -> None:
    """The pool process ``pid`` is gone (killed on an owner's request)."""
    slots.let_go([slots.slot_key(worker, pid)])
    WorkerSlot.objects.filter(worker__name=worker, pid=pid).delete()


def send_consumer_command(worker: str, *, queue: str, consume: bool, timeout: float) -> list:
    """Celery's ``add_consumer`` / ``cancel_consumer`` for ``queue``, to the
    worker named ``worker`` only; the replies of its main process (a list of
    ``{"ok": ...}`` or ``{"error": ...}``), empty when it did not answer
    within ``timeout`` or the broker is down."""
    from celery import current_app

    control = current_app.control
    command = control.add_consumer if consume else control.cancel_consumer
    try:
        replies = command(queue, destination=[worker], reply=True, timeout=timeout) or []
    except Exception:
        log.exception("%s %s to %s not sent", "add_consumer" if consume else "cancel_consumer",
                      queue, worker)  # fmt: skip
        return []
    # [{node name: {"ok": text}}] -> [{"ok": text}]
    return [answer for reply in replies for answer in reply.values()]
