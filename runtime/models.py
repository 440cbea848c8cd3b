"""The runtime's tables: an endpoint's exclusive lock, its turns and
history, and the workers that run them.

Writes live in the ``runtime/turns/`` package (turns, lock, quarantine) and
``runtime/registry.py`` (workers). Nothing else sets a state field.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from core.ids import new_id
from endpoints.models import Endpoint, RunnerKind


class EndpointLock(models.Model):
    """One row per endpoint. Taken FOR UPDATE from turn start through exact
    completion or failure isolation; ``holder`` is the one turn allowed to
    change the endpoint's context, ``token`` its fencing ``seq``."""

    endpoint = models.OneToOneField(
        Endpoint, primary_key=True, on_delete=models.CASCADE, related_name="lock"
    )
    holder = models.OneToOneField(
        "Turn", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    token = models.BigIntegerField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Holder and token are set and cleared together.
            models.CheckConstraint(
                condition=(Q(holder__isnull=True) & Q(token__isnull=True))
                | (Q(holder__isnull=False) & Q(token__isnull=False)),
                name="lock_holder_token_together",
            ),
        ]

    def __str__(self) -> str:
        return f"lock of {self.endpoint_id} held by {self.holder_id or 'nobody'}"


class TurnState(models.TextChoices):
    # running -> completed | failed | interrupting -> stopped | uncertain
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTING = "interrupting"
    STOPPED = "stopped"
    UNCERTAIN = "uncertain"
    # An uncertain turn closed by an owner decision without stop evidence.
    UNRESOLVED = "unresolved"


TURN_ACTIVE_STATES = (TurnState.RUNNING, TurnState.INTERRUPTING)


class Turn(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: turn_seq_unique (endpoint, seq) leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.PROTECT, related_name="turns", db_index=False
    )
    ticket = models.ForeignKey("tickets.Ticket", on_delete=models.PROTECT, related_name="turns")
    seq = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=TurnState.choices, default=TurnState.RUNNING)
    runner_kind = models.CharField(max_length=16, choices=RunnerKind.choices)
    celery_task_id = models.CharField(max_length=255, blank=True, default="")
    worker = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    interrupt_requested_at = models.DateTimeField(null=True, blank=True)
    interrupt_reason = models.CharField(max_length=32, blank=True, default="")
    ended_at = models.DateTimeField(null=True, blank=True)
    # What proves it ended: {kind, observed_at, detail}.
    stop_evidence = models.JSONField(null=True, blank=True)
    # SHA-256 of the credential handed to this turn's runner in its envelope:
    # the only credential the turn API accepts for this turn. The token itself
    # is never stored; empty (turns from before tokens) matches nothing.
    token_sha256 = models.CharField(max_length=64, blank=True, default="", db_default="")
    # The endpoint generation it ran under (its start wrote the endpoint's
    # current one): a change approved while it runs does not touch it.
    generation = models.PositiveIntegerField(default=1, db_default=1)

    class Meta:
        ordering = ["endpoint_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "seq"], name="turn_seq_unique"),
            models.CheckConstraint(
                condition=Q(state__in=TurnState.values), name="turn_state_valid"
            ),
        ]
        indexes = [
            # The budget sweeps scan only active turns: their cost follows the
            # number of running turns, not the size of the ledger.
            models.Index(
                fields=["deadline_at"],
                name="turn_active_deadline_idx",
                condition=Q(state__in=["running", "interrupting"]),
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.id} #{self.seq}"


class ContextEntry(models.Model):
    """The endpoint's history: one entry per completed turn."""

    # No index of its own: context_recent_idx (endpoint, -seq) leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="history", db_index=False
    )
    turn = models.OneToOneField(Turn, on_delete=models.PROTECT, related_name="context_entry")
    ticket = models.ForeignKey("tickets.Ticket", on_delete=models.PROTECT, related_name="+")
    seq = models.BigIntegerField()
    input = models.JSONField(null=True)
    result = models.JSONField(null=True)
    artifacts = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["endpoint_id", "seq"]
        verbose_name_plural = "context entries"
        indexes = [models.Index(fields=["endpoint", "-seq"], name="context_recent_idx")]

    def __str__(self) -> str:
        return f"context {self.endpoint_id} #{self.seq}"


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
    """One pool process of a worker, and the turn it runs (null: idle)."""

    # No index of its own: worker_slot_unique_pid (worker, pid) leads with it.
    worker = models.ForeignKey(
        Worker, on_delete=models.CASCADE, related_name="slots", db_index=False
    )
    pid = models.IntegerField()
    # Rewritten at every start and finish: no foreign key to check and no
    # index to update each time (the table holds one row per pool process,
    # so a lookup by turn reads a handful of rows). A slot may name a turn
    # that retention deleted since: its readers join it outer.
    turn = models.ForeignKey(
        Turn,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
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
