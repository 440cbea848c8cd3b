"""Schedules: an endpoint's recurring admissions (tickets/schedules.py owns
every write). Imported by ``tickets.models`` so Django finds them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.ids import new_id

# The longest cron expression accepted (six fields with lists fit easily).
CRON_CHARS = 200


class CatchUp(models.TextChoices):
    """What happens to slots that passed while nothing fired (beat down,
    every control worker busy): ``none`` fires only slots within
    ``SCHEDULE_GRACE_S`` of now, ``latest`` only the newest missed one,
    ``all`` every one (the newest ``SCHEDULE_MAX_CATCH_UP``). The rest are
    recorded as skipped."""

    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class SlotOutcome(models.TextChoices):
    ADMITTED = "admitted"  # a new ticket
    DUPLICATE = "duplicate"  # the slot's ticket already existed (its dedupe key)
    REFUSED = "refused"  # admission refused it (quarantine, forbidden, ...): not retried
    SKIPPED = "skipped"  # missed and dropped by the catch-up policy (detail: how many)


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", on_delete=models.PROTECT, related_name="schedules"
    )
    # Exactly one of the two (schedule_cron_or_every).
    cron = models.CharField(max_length=CRON_CHARS, blank=True, default="")
    every_s = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    input = models.JSONField(default=dict)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.NONE)
    paused = models.BooleanField(default=False)
    # The first slot not handled yet; NULL exactly while paused
    # (schedule_paused_has_no_next). The beat's query reads schedule_due_idx.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    # The newest slot handled (fired, refused or skipped).
    last_slot_at = models.DateTimeField(null=True, blank=True)
    # Slots are admitted as this user (their submitter rights); a schedule
    # whose creator is gone records each slot as refused.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every_s__isnull=False) & Q(every_s__gt=0))
                | (~Q(cron="") & Q(every_s__isnull=True)),
                name="schedule_cron_or_every",
            ),
            models.CheckConstraint(
                condition=Q(catch_up__in=["none", "latest", "all"]), name="schedule_catch_up_valid"
            ),
            models.CheckConstraint(
                condition=Q(paused=True, next_fire_at__isnull=True)
                | Q(paused=False, next_fire_at__isnull=False),
                name="schedule_paused_has_no_next",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_fire_at"], name="schedule_due_idx", condition=Q(paused=False)
            ),
        ]

    def __str__(self) -> str:
        return f"schedule {self.id} of {self.endpoint_id}"


class ScheduleSlot(models.Model):
    """One row per slot handled: what became of it. At most one per slot
    (schedule_slot_unique); the newest ``SCHEDULE_SLOT_HISTORY`` of a
    schedule are kept."""

    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="slots", db_index=False
    )
    slot_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=SlotOutcome.choices)
    # No database constraint: retention deletes old tickets by SQL, and the
    # slot keeps the id as history.
    ticket = models.ForeignKey(
        "tickets.Ticket",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["schedule_id", "slot_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot_at"], name="schedule_slot_unique"),
            models.CheckConstraint(
                condition=Q(outcome__in=["admitted", "duplicate", "refused", "skipped"]),
                name="schedule_slot_outcome_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.outcome} slot {self.slot_at:%Y-%m-%dT%H:%M:%SZ} of {self.schedule_id}"
