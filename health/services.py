"""The only writes of the health app: a sweep records that it ran."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.utils import timezone

from core import observe
from core.transient import TRANSIENT_ERRORS, drop_broken_connection, warn_transient

from .models import SweepRun

log = logging.getLogger(__name__)


def record_sweep(*, name: str) -> None:
    """Record that the sweep ``name`` just finished. Cheap and conditional:
    one UPDATE that writes only when the stored time is older than half the
    sweep's period, so however many beats or workers run the sweep, the row
    is written at most twice per period (and /readyz, which allows three
    periods, still sees it fresh)."""
    from core.sweeps import sweep_intervals

    now = timezone.now()
    # At most the common period's pace (check_sweeps allows as much): the
    # schedules' one-second tick need not write its row every second.
    from django.conf import settings

    period = max(sweep_intervals().get(name, 0.0), settings.SWEEP_INTERVAL_S)
    gap = timedelta(seconds=period / 2)
    if SweepRun.objects.filter(name=name, last_finished_at__lt=now - gap).update(
        last_finished_at=now
    ):
        return
    # Fresh already, or the first run ever: an insert that a present row ignores.
    SweepRun.objects.bulk_create([SweepRun(name=name, last_finished_at=now)], ignore_conflicts=True)


@contextmanager
def sweep_run(name: str) -> Iterator[None]:
    """Wrap one run of a sweep task: record it when it finishes; a transient
    database or broker fault is logged in one line and swallowed (the next
    beat tick runs the sweep again; a Celery task must not fail noisily, nor
    leave a broken connection behind, for an outage)."""
    with tolerate_transient(f"sweep {name}"), observe.sweep(name):
        yield
        record_sweep(name=name)


@contextmanager
def tolerate_transient(what: str) -> Iterator[None]:
    """For control-queue tasks the ledger will redo (sweeps, a delivery
    attempt the delivery sweep sends again): a transient fault is a WARNING
    and the task ends; anything else propagates."""
    try:
        yield
    except TRANSIENT_ERRORS as exc:
        warn_transient(log, f"{what} skipped (the next run retries)", exc)
        drop_broken_connection()
