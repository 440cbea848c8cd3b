"""Schedules under real beat and control workers: a schedule firing every
second while beat is killed and restarted, a second beat runs beside it
(then alone) and two control workers take the ticks: exactly one ticket per
slot, and no gap (catch_up "all")."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.conftest import wait_for
from tickets import schedules
from tickets.models import Schedule, ScheduleSlot, Ticket

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _slots_admitted(schedule_id) -> int:
    return Ticket.objects.filter(dedupe_key__startswith=f"schedule:{schedule_id}:").count()


def _slots_after(schedule_id, moment, n: int) -> None:
    wait_for(
        lambda: Schedule.objects.get(id=schedule_id).last_slot_at >= moment + timedelta(seconds=n),
        timeout=60,
        message=f"{n} slots after {moment}",
    )


def _beat(procs, name: str) -> None:
    since = len(procs.log(name))
    procs.start(name, "beat", "--loglevel", "INFO", "-s", str(procs.tmp / f"{name}-schedule"))
    wait_for(
        lambda: b"beat: Starting" in procs.log(name)[since:],
        timeout=60,
        message=f"{name} to start",
    )


def test_every_slot_is_one_ticket_through_a_killed_beat_a_second_beat_and_two_workers(
    celery_procs, make_endpoint, django_user_model, settings
):
    settings.SCHEDULE_MIN_INTERVAL_S = 1
    celery_procs.env.update(SCHEDULE_TICK_S="0.3", SCHEDULE_SLOT_HISTORY="1000")
    olive = django_user_model.objects.create_user("olive")
    make_endpoint("tick", owners=["olive"])
    celery_procs.worker("control-a", queues="control", concurrency=1)
    celery_procs.worker("control-b", queues="control", concurrency=1)
    _beat(celery_procs, "beat")
    schedule = schedules.create_schedule(
        user=olive, endpoint="tick", every_s=1, input={"brief": "weekly"}, catch_up="all"
    )
    first = schedule.next_fire_at

    # 1. Beat alone: slots fire.
    wait_for(lambda: _slots_admitted(schedule.id) >= 8, timeout=60, message="8 slots")

    # 2. Beat killed (no clean shutdown) while slots keep passing.
    celery_procs.kill("beat", signal.SIGKILL)
    killed_at = timezone.now()
    wait_for(
        lambda: timezone.now() > killed_at + timedelta(seconds=4),
        timeout=10,
        message="four slots to pass without beat",
    )

    # 3. Beat restarted, and a second beat beside it (a duplicated beat).
    _beat(celery_procs, "beat")
    _beat(celery_procs, "beat2")
    _slots_after(schedule.id, timezone.now(), 5)

    # 4. The first beat killed again: the second alone keeps the slots coming.
    celery_procs.kill("beat", signal.SIGKILL)
    _slots_after(schedule.id, timezone.now(), 5)

    # The pause's UPDATE waits for a pass holding the row; no pass fires a
    # paused schedule after it: last_slot_at is final.
    schedules.pause_schedule(schedule_id=schedule.id, user=olive)
    schedule.refresh_from_db()
    last = schedule.last_slot_at

    # Exactly one ticket per slot from the first to the last, and no gap:
    # the slots missed while beat was down were caught up (catch_up "all").
    expected = []
    slot = first
    while slot <= last:
        expected.append(schedules.slot_key(schedule.id, slot))
        slot += timedelta(seconds=1)
    keys = list(
        Ticket.objects.filter(dedupe_key__startswith=f"schedule:{schedule.id}:").values_list(
            "dedupe_key", flat=True
        )
    )
    assert sorted(keys) == expected, (len(keys), len(expected))
    assert len(expected) >= 8 + 4 + 5 + 5
    outcomes = list(
        ScheduleSlot.objects.filter(schedule=schedule).values_list("outcome", flat=True)
    )
    assert len(outcomes) == len(expected) and set(outcomes) == {"admitted"}

    # Both control workers fired slots.
    for name in ("control-a", "control-b"):
        assert b"sweep schedules: admitted" in celery_procs.log(name), name
