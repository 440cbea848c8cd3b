"""What /readyz needs to know that no process can tell about itself: when
each sweep last finished (a dead beat or control worker leaves no trace)."""

from __future__ import annotations

from django.db import models


class SweepRun(models.Model):
    """One row per sweep name (``config.celery.SWEEP_TASKS``), refreshed by
    the sweep's task each time it finishes (at most twice per period)."""

    name = models.CharField(max_length=64, primary_key=True)
    last_finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} {self.last_finished_at:%Y-%m-%d %H:%M:%S}"
