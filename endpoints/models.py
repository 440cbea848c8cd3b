"""The endpoint directory: endpoints (agent contexts), their aliases,
generations, change proposals and route generations.

Writes live in ``endpoints/services.py`` and ``endpoints/proposals.py``
(configuration); the state (available / quarantined) and the open case are
written by the runtime's quarantine (``runtime/turns/quarantine.py``).
Nothing else sets a state field. The lock, turns and workers are the
runtime's (``runtime/models.py``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core import limits
from core.ids import new_id


class EndpointState(models.TextChoices):
    # available <-> quarantined; only an owner decision leaves quarantine.
    # A pause is not a state: it is the owner's flag ``paused_at``, beside the
    # state, so a pause and a quarantine can hold at once and neither clears
    # the other (docs/explanation/design.md, "Pause").
    AVAILABLE = "available"
    QUARANTINED = "quarantined"


class BusyPolicy(models.TextChoices):
    ENQUEUE = "enqueue"
    REJECT = "reject"
    # A new ticket queues and asks the turn running at its admission to stop
    # (docs/explanation/design.md, "Busy policies"); queued tickets are never cancelled.
    INTERRUPT = "interrupt"


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
    # The open recovery case of a quarantined endpoint, null otherwise: written
    # with ``state`` by the runtime's quarantine and cleared by its release
    # (runtime/turns/quarantine.py), so admission's refusal and the
    # endpoint's payload read it on this row (recovery sits above both).
    quarantine_case = models.UUIDField(null=True, blank=True)
    # Monotonic counter: each turn takes ++turn_seq as its fencing token.
    turn_seq = models.BigIntegerField(default=0)
    # Paused by an owner (null: not paused): admission queues or refuses per
    # busy_policy, and no turn starts (claimcheck_start_turn); the running
    # turn finishes. Set and cleared only by runtime.services.pause_endpoint /
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
            # Only a quarantined endpoint names an open case.
            models.CheckConstraint(
                condition=Q(quarantine_case__isnull=True) | Q(state=EndpointState.QUARANTINED),
                name="endpoint_case_when_quarantined",
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
