"""Endpoints (agent contexts), their exclusive lock, turns and history.

Writes live in the ``endpoints/runtime/`` package (turns, lock, quarantine) and
``endpoints/services.py`` (endpoint configuration). Nothing else sets a state
field.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core import limits
from tickets.ids import new_id


class EndpointState(models.TextChoices):
    # available <-> quarantined; only an owner decision leaves quarantine.
    # A pause is not a state: it is the owner's flag ``paused_at``, beside the
    # state, so a pause and a quarantine can hold at once and neither clears
    # the other (docs/design.md, "Pause").
    AVAILABLE = "available"
    QUARANTINED = "quarantined"


class BusyPolicy(models.TextChoices):
    ENQUEUE = "enqueue"
    REJECT = "reject"


class RunnerKind(models.TextChoices):
    PYTHON = "python"
    COMMAND = "command"
    HTTP = "http"
    AGENT = "agent"


class Endpoint(models.Model):
    address = models.SlugField(max_length=limits.ADDRESS_CHARS, unique=True, allow_unicode=False)
    owners = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    runner = models.JSONField(default=dict)
    turn_budget_s = models.FloatField(default=300.0)
    interrupt_grace_s = models.FloatField(default=10.0)
    heartbeat_timeout_s = models.FloatField(default=30.0)
    requires_approval = models.BooleanField(default=False)
    busy_policy = models.CharField(
        max_length=16, choices=BusyPolicy.choices, default=BusyPolicy.ENQUEUE
    )
    state = models.CharField(
        max_length=16, choices=EndpointState.choices, default=EndpointState.AVAILABLE
    )
    # Monotonic counter: each turn takes ++turn_seq as its fencing token.
    turn_seq = models.BigIntegerField(default=0)
    # Paused by an owner (null: not paused): admission queues or refuses per
    # busy_policy, and no turn starts (claimcheck_start_turn); the running
    # turn finishes. Set and cleared only by services.pause_endpoint /
    # resume_endpoint, each with an EndpointEvent.
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_actor = models.CharField(max_length=200, blank=True, default="", db_default="")
    pause_reason = models.TextField(blank=True, default="", db_default="")
    # Who may submit tickets. Unrestricted (any key) unless this flag is set;
    # then only the listed users, members of the listed groups, the owners and
    # staff. Admission's one-statement fast path reads only the flag, so an
    # unrestricted endpoint pays no extra query; a restricted one takes the
    # general path, which checks the lists (endpoints.selectors.may_submit).
    submit_restricted = models.BooleanField(default=False, db_default=False)
    submitter_users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    submitter_groups = models.ManyToManyField("auth.Group", blank=True, related_name="+")
    # The current generation of the behaviour-defining fields (GENERATION_FIELDS):
    # the row keeps the current values so a turn's start reads one row; every
    # change of them is an EndpointGeneration (endpoints/services.py, change_generation).
    generation = models.PositiveIntegerField(default=1, db_default=1)
    # Notes for the next run: lines every later turn's runner is handed
    # (TurnContext.notes, the http envelope, an agent's instructions).
    notes = models.TextField(blank=True, default="", db_default="")
    # May a proposer approve their own change? None: the global setting
    # CHANGE_REQUIRES_SECOND_PERSON decides.
    change_requires_second_person = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["address"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=EndpointState.values), name="endpoint_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(busy_policy__in=BusyPolicy.values), name="endpoint_busy_policy_valid"
            ),
            models.CheckConstraint(
                condition=Q(turn_budget_s__gt=0)
                & Q(interrupt_grace_s__gt=0)
                & Q(heartbeat_timeout_s__gt=0),
                name="endpoint_budgets_positive",
            ),
            # A pause always says who and why; no reason lingers after it.
            models.CheckConstraint(
                condition=(Q(paused_at__isnull=True) & Q(pause_reason="") & Q(pause_actor=""))
                | (Q(paused_at__isnull=False) & ~Q(pause_reason="")),
                name="endpoint_pause_explained",
            ),
        ]

    def __str__(self) -> str:
        return self.address


# The behaviour-defining configuration of an endpoint: what a generation
# snapshots, and all a proposal may change.
GENERATION_FIELDS = (
    "runner",
    "turn_budget_s",
    "interrupt_grace_s",
    "heartbeat_timeout_s",
    "busy_policy",
    "requires_approval",
    "notes",
)


class EndpointGeneration(models.Model):
    """Append-only (UPDATE, DELETE and TRUNCATE refused): one version of an
    endpoint's behaviour-defining configuration. Number 1 is written with
    the endpoint; every change writes N+1 (endpoints/services.py, change_generation) in the
    transaction that changes the endpoint row, conditional on N being
    current. ``changes`` is the diff against N-1 ({field: {from, to}})."""

    # No index of its own: generation_number_unique leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.DO_NOTHING, related_name="generations", db_index=False
    )
    number = models.PositiveIntegerField()
    config = models.JSONField()
    changes = models.JSONField(default=dict)
    actor = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    # The approved proposal it applies (None: a staff change or generation 1).
    proposal = models.ForeignKey(
        "endpoints.ChangeProposal",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
    )
    # A rollback: the earlier generation whose content it restores.
    restores = models.PositiveIntegerField(null=True, blank=True)
    # The seq of the first turn that can run under it (the endpoint's
    # turn_seq + 1 when it was written, under the endpoint row's lock, which
    # a turn's start takes too): the turns of generation N are the seqs from
    # its first_seq to N+1's, a range of the (endpoint, seq) index.
    first_seq = models.BigIntegerField(default=1)
    at = models.DateTimeField()

    class Meta:
        ordering = ["endpoint_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "number"], name="generation_number_unique"),
            models.CheckConstraint(condition=Q(number__gte=1), name="generation_number_positive"),
        ]

    def __str__(self) -> str:
        return f"generation {self.number} of {self.endpoint_id}"


class ChangeProposal(models.Model):
    """Append-only: a proposed change of an endpoint's configuration, a diff
    against the generation it names. Its status is its one review
    (ChangeReview): none yet is open."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.DO_NOTHING, related_name="proposals")
    base_generation = models.PositiveIntegerField()
    # {field: new value}, fields from GENERATION_FIELDS only.
    changes = models.JSONField()
    # {field: {from, to}} against base_generation.
    diff = models.JSONField()
    reason = models.TextField()
    proposer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    # Where it came from: {} (an owner directly) or {"lesson": id, "case": id}.
    origin = models.JSONField(default=dict, blank=True)
    restores = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"proposal {self.id} for {self.endpoint_id}"


class ReviewVerdict(models.TextChoices):
    APPROVED = "approved"
    REJECTED = "rejected"


class ChangeReview(models.Model):
    """Append-only: the decision on a proposal, one per proposal (the unique
    proposal column is the guard two racing reviewers meet). An approval
    names the generation it applied."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    proposal = models.OneToOneField(
        ChangeProposal, on_delete=models.DO_NOTHING, related_name="review"
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    verdict = models.CharField(max_length=16, choices=ReviewVerdict.choices)
    reason = models.TextField()
    generation = models.PositiveIntegerField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(verdict="approved") & Q(generation__isnull=False))
                | (Q(verdict="rejected") & Q(generation__isnull=True)),
                name="review_verdict_generation",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} {self.proposal_id}"


class RouteGeneration(models.Model):
    """Append-only: where an alias (a route) points, one row per change:
    added, moved to another endpoint, removed (endpoint None). Admission
    reads it to keep a key's identity across a move: a key admitted through
    the alias before it moved is found on the endpoint it ran on."""

    alias = models.SlugField(max_length=limits.ADDRESS_CHARS, db_index=False)
    number = models.PositiveIntegerField()
    endpoint = models.ForeignKey(
        Endpoint, null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+"
    )
    actor = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["alias", "number"]
        constraints = [
            models.UniqueConstraint(fields=["alias", "number"], name="route_generation_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.alias} #{self.number} -> {self.endpoint_id}"


class EndpointEvent(models.Model):
    """Append-only (a trigger refuses UPDATE and DELETE): every change of who
    or what runs for an endpoint, and who may ask it: created, runner, owners,
    submitters (and budgets and policies). ``endpoints/services.py`` writes
    it in the same transaction as the change."""

    # No index of its own: endpoint_event_idx leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.DO_NOTHING, related_name="events", db_index=False
    )
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["endpoint", "id"], name="endpoint_event_idx")]

    def __str__(self) -> str:
        return f"{self.kind} on {self.endpoint_id}"


class EndpointAlias(models.Model):
    """An old address that resolves to an endpoint (compatibility routes)."""

    alias = models.SlugField(max_length=limits.ADDRESS_CHARS, unique=True)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="aliases")

    class Meta:
        ordering = ["alias"]
        verbose_name_plural = "endpoint aliases"

    def __str__(self) -> str:
        return f"{self.alias} -> {self.endpoint_id}"


class EndpointLock(models.Model):
    """One row per endpoint. Taken FOR UPDATE from turn start through exact
    completion or failure isolation; ``holder`` is the one turn allowed to
    change the endpoint's context, ``token`` its fencing ``seq``."""

    endpoint = models.OneToOneField(
        Endpoint, primary_key=True, on_delete=models.CASCADE, related_name="lock"
    )
    holder = models.OneToOneField(
        "endpoints.Turn", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
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
    (``endpoints.registry``). A worker whose ``last_seen_at`` is older than
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
    # The slot's warm turn process (endpoints/isolation.py), which runs its
    # process-isolated turns: written when one is forked, not per turn.
    child_pid = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker", "pid"], name="worker_slot_unique_pid")
        ]

    def __str__(self) -> str:
        return f"{self.worker_id}:{self.pid}"
