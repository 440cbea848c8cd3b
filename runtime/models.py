"""The runtime's tables: the workers that run turns, their pool processes
and what staff asked of them. The turns, the endpoint's lock and its
history are the ledger's (tickets/models.py).

Writes live in ``runtime/registry.py`` and ``runtime/services.py``. Nothing
else sets a state field.
"""

from __future__ import annotations

from django.db import models


class Worker(models.Model):
    """A Celery worker that runs turns, registered and heartbeated by itself
    (``runtime.registry``). A worker whose ``last_seen_at`` is older than
    ``WORKER_LOST_AFTER_S`` is shown as lost."""

    name = models.CharField(max_length=255, unique=True)  # the Celery node name
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    pool_size = models.IntegerField(default=0)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # The task queues its consumer takes messages from now, as the worker's
    # main process reports them at registration and every heartbeat: staff
    # stop and resume a queue with Celery's cancel_consumer / add_consumer
    # (services.set_worker_consuming), and a restart consumes ``queues`` again.
    consuming = models.JSONField(default=list)

    def __str__(self) -> str:
        return self.name


class WorkerEvent(models.Model):
    """Append-only: who asked a worker to stop or resume consuming a queue,
    why, and what the worker answered (``services.set_worker_consuming``).
    Keyed by the worker's node name, so the line outlives the registry row."""

    worker = models.CharField(max_length=255, db_index=True)
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} on {self.worker}"


class WorkerSlot(models.Model):
    """One pool process of a worker (the turn it runs: runtime.selectors)."""

    # No index of its own: worker_slot_unique_pid (worker, pid) leads with it.
    worker = models.ForeignKey(
        Worker, on_delete=models.CASCADE, related_name="slots", db_index=False
    )
    pid = models.IntegerField()
    # The turn it runs is the ledger's record, not this row's: the turn's
    # start names the slot on the turn (Turn.slot) and its finish lets go of
    # it (Turn.released_at), in their own statements; runtime.selectors
    # reads a slot's newest turn. The column turn_id stays, unwritten, while
    # the previous release may run beside this one (a later release drops it).
    since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    # The slot's warm turn process (runtime/isolation.py), which runs its
    # process-isolated turns: written when one is forked, not per turn.
    child_pid = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker", "pid"], name="worker_slot_unique_pid")
        ]

    def __str__(self) -> str:
        return f"{self.worker_id}:{self.pid}"
