"""Recovery: cases, immutable inspections, owner decisions, lessons.

Writes live in ``recovery/services.py``. Inspections, decisions, lessons and
case evidence are append-only in the database (see migrations).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.ids import new_id


class CaseState(models.TextChoices):
    OPEN = "open"
    DECIDED = "decided"
    CLOSED = "closed"


class RecoveryCase(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", on_delete=models.PROTECT, related_name="recovery_cases"
    )
    turn = models.ForeignKey("tickets.Turn", on_delete=models.PROTECT, related_name="+")
    ticket = models.ForeignKey("tickets.Ticket", on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    state = models.CharField(max_length=8, choices=CaseState.choices, default=CaseState.OPEN)
    opened_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        constraints = [
            # One open case per endpoint: a second sweep that races to open
            # one for the same endpoint fails on this index.
            models.UniqueConstraint(
                fields=["endpoint"], condition=Q(state="open"), name="one_open_case_per_endpoint"
            ),
            models.CheckConstraint(
                condition=Q(state__in=CaseState.values), name="case_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"case {self.id}"


class CaseEvidence(models.Model):
    """Evidence that arrived for the uncertain turn after quarantine (a late
    result or stop receipt): stored, applied to nothing."""

    case = models.ForeignKey(RecoveryCase, on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=32)
    seq = models.BigIntegerField(null=True)
    detail = models.JSONField(default=dict)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "case evidence"

    def __str__(self) -> str:
        return f"{self.kind} for case {self.case_id}"


class Inspection(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    case = models.ForeignKey(RecoveryCase, on_delete=models.PROTECT, related_name="inspections")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    snapshot = models.JSONField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"inspection {self.id} of case {self.case_id}"


class DecisionAction(models.TextChoices):
    FINALIZE_ORPHAN = "finalize_orphan"
    AUTHORIZE_RERUN = "authorize_rerun"
    KEEP_QUARANTINED = "keep_quarantined"
    RELEASE = "release"


class Decision(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    case = models.ForeignKey(RecoveryCase, on_delete=models.PROTECT, related_name="decisions")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=20, choices=DecisionAction.choices)
    rationale = models.TextField()
    evidence = models.TextField(blank=True, default="")
    inspection = models.ForeignKey(Inspection, on_delete=models.PROTECT, related_name="+")
    rerun_ticket = models.ForeignKey(
        "tickets.Ticket", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.action} on case {self.case_id}"


class Lesson(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    case = models.OneToOneField(RecoveryCase, on_delete=models.PROTECT, related_name="lesson")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    what_failed = models.TextField()
    evidence = models.TextField()
    prevention = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"lesson of case {self.case_id}"


class ProcessStop(models.Model):
    """An owner's "stop the process": the pool process that still runs an
    inline turn after its case was decided is killed by the worker on its
    host, targeting the recorded pid, never by task id. Recorded like a
    decision (actor, rationale); ``outcome`` and ``exit`` are filled in by
    that worker, and the exit is also late evidence on the case."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    case = models.ForeignKey(RecoveryCase, on_delete=models.PROTECT, related_name="process_stops")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    rationale = models.TextField()
    worker = models.CharField(max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    # requested | killed | gone | refused | unreachable (recovery.services);
    # all but killed carry exit["reason"].
    outcome = models.CharField(max_length=20, default="requested")
    exit = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"stop of process {self.pid} on {self.host} for case {self.case_id}"
