"""Schedules (tickets/schedules.py, docs/howto/schedules.md): slots, catch-up
policies on a clock the test controls, refusals recorded once, concurrent
firing passes converging on one ticket per slot, and the API's rules."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from accounts.keys import create_api_key
from core.errors import Invalid
from endpoints.models import Endpoint
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets import schedules
from tickets.admission import admit_ticket
from tickets.models import Schedule, ScheduleSlot, Ticket

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 7, 12, 0, 30, 250000, tzinfo=UTC)  # mid-minute, with microseconds


@pytest.fixture(autouse=True)
def _short_intervals(settings):
    settings.SCHEDULE_MIN_INTERVAL_S = 1
    settings.SCHEDULE_GRACE_S = 90
    settings.SCHEDULE_MAX_CATCH_UP = 100


@pytest.fixture
def olive(django_user_model):
    return django_user_model.objects.create_user("olive")


def _every(make_endpoint, olive, every_s=60, catch_up="none", address="sched", **kw):
    if not Endpoint.objects.filter(address=address).exists():
        make_endpoint(address, owners=["olive"])
    return schedules.create_schedule(
        user=olive,
        endpoint=address,
        every_s=every_s,
        input={"q": "brief"},
        catch_up=catch_up,
        now=T0,
        **kw,
    )


def _keys(schedule) -> list[str]:
    return sorted(
        Ticket.objects.filter(dedupe_key__startswith=f"schedule:{schedule.id}:").values_list(
            "dedupe_key", flat=True
        )
    )


def _at(minute: int, second: int = 0) -> datetime:
    return T0.replace(minute=minute, second=second, microsecond=0)


def test_each_slot_is_one_ticket_with_its_key_as_the_creator(make_endpoint, olive):
    schedule = _every(make_endpoint, olive)
    assert schedule.next_fire_at == _at(1)  # epoch-aligned: the next whole minute
    assert schedules.fire_due(now=_at(0, 59)).schedules == 0  # not due yet

    fired = schedules.fire_due(now=_at(1, 2))
    assert fired.schedules == 1 and fired.outcomes == {"admitted": 1}
    (ticket,) = Ticket.objects.filter(dedupe_key__startswith=f"schedule:{schedule.id}:")
    assert ticket.dedupe_key == f"schedule:{schedule.id}:2026-12-07T12:01:00Z"
    assert ticket.submitted_by_id == olive.id and ticket.input == {"q": "brief"}
    assert ticket.requester["metadata"] == {
        "schedule": str(schedule.id),
        "slot": "2026-12-07T12:01:00Z",
    }

    # Again at the same moment, and directly: nothing is due any more.
    assert schedules.fire_due(now=_at(1, 2)).schedules == 0
    assert schedules.fire_schedule(schedule_id=schedule.id, now=_at(1, 2)) is False
    schedule.refresh_from_db()
    assert (schedule.last_slot_at, schedule.next_fire_at) == (_at(1), _at(2))
    (slot,) = ScheduleSlot.objects.filter(schedule=schedule)
    assert (slot.outcome, slot.ticket_id) == ("admitted", ticket.id)


def test_catch_up_none_fires_only_slots_within_the_grace(make_endpoint, olive):
    schedule = _every(make_endpoint, olive, catch_up="none")
    fired = schedules.fire_due(now=_at(10, 5))  # slots 12:01..12:10 due; grace 90 s
    assert fired.outcomes == {"admitted": 2, "skipped": 8}
    assert _keys(schedule) == [
        f"schedule:{schedule.id}:2026-12-07T12:09:00Z",
        f"schedule:{schedule.id}:2026-12-07T12:10:00Z",
    ]
    skipped = ScheduleSlot.objects.get(schedule=schedule, outcome="skipped")
    assert skipped.slot_at == _at(8)
    assert skipped.detail["skipped"] == 8 and skipped.detail["from"] == "2026-12-07T12:01:00Z"


def test_catch_up_latest_fires_only_the_newest_missed_slot(make_endpoint, olive):
    schedule = _every(make_endpoint, olive, catch_up="latest")
    fired = schedules.fire_due(now=_at(10, 5))
    assert fired.outcomes == {"admitted": 1, "skipped": 9}
    assert _keys(schedule) == [f"schedule:{schedule.id}:2026-12-07T12:10:00Z"]
    schedule.refresh_from_db()
    assert schedule.next_fire_at == _at(11)


def test_catch_up_all_fires_every_missed_slot_up_to_the_bound(make_endpoint, olive, settings):
    schedule = _every(make_endpoint, olive, catch_up="all")
    fired = schedules.fire_due(now=_at(10, 5))
    assert fired.outcomes == {"admitted": 10}
    assert _keys(schedule) == [
        f"schedule:{schedule.id}:2026-12-07T12:{m:02d}:00Z" for m in range(1, 11)
    ]
    # A longer outage: only the newest SCHEDULE_MAX_CATCH_UP fire, the rest are one record.
    settings.SCHEDULE_MAX_CATCH_UP = 5
    fired = schedules.fire_due(now=_at(30, 0))
    assert fired.outcomes == {"admitted": 5, "skipped": 15}
    assert len(_keys(schedule)) == 15
    assert ScheduleSlot.objects.get(schedule=schedule, outcome="skipped").detail["to"] == (
        "2026-12-07T12:25:00Z"
    )


def test_a_cron_follows_its_time_zone_across_daylight_saving(make_endpoint, olive):
    make_endpoint("weekly", owners=["olive"])
    schedule = schedules.create_schedule(
        user=olive,
        endpoint="weekly",
        cron="0 9 * * 1",
        timezone="Europe/Berlin",
        input={},
        now=datetime(2027, 3, 10, tzinfo=UTC),
    )
    # Monday 09:00 in Berlin: 08:00Z in winter, 07:00Z after 28 March.
    assert schedules.next_fire_times(schedule) == [
        datetime(2027, 3, 15, 8, tzinfo=UTC),
        datetime(2027, 3, 22, 8, tzinfo=UTC),
        datetime(2027, 3, 29, 7, tzinfo=UTC),
    ]
    schedules.fire_due(now=datetime(2027, 3, 15, 8, 0, 1, tzinfo=UTC))
    assert _keys(schedule) == [f"schedule:{schedule.id}:2027-03-15T08:00:00Z"]


def test_a_refused_slot_is_recorded_once_and_never_retried(make_endpoint, olive):
    """A quarantined endpoint refuses the slot (423): the slot's outcome says
    so, the schedule moves on, and the next slot is tried on its own."""
    make_endpoint("held", owners=["olive"], interrupt_grace_s=0.05)
    schedule = _every(make_endpoint, olive, address="held")
    stuck = admit_ticket(endpoint="held", input={"task": "stuck"}).ticket
    started = runtime.start_turn(ticket_id=stuck.id)
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    wait_for(lambda: runtime.quarantine_turn(turn_id=started.turn.id), timeout=5, message="grace")

    assert schedules.fire_due(now=_at(1, 1)).outcomes == {"refused": 1}
    assert schedules.fire_due(now=_at(1, 30)).schedules == 0  # not retried
    slot = ScheduleSlot.objects.get(schedule=schedule)
    assert (slot.outcome, slot.ticket_id, slot.detail["error"]) == (
        "refused",
        None,
        "endpoint_quarantined",
    )
    assert schedules.fire_due(now=_at(2, 1)).outcomes == {"refused": 1}
    assert ScheduleSlot.objects.filter(schedule=schedule, outcome="refused").count() == 2
    assert _keys(schedule) == []


def test_paused_schedules_do_not_fire_and_resume_skips_the_pause(make_endpoint, olive):
    schedule = _every(make_endpoint, olive)
    schedule, changed = schedules.pause_schedule(schedule_id=schedule.id, user=olive)
    assert changed and schedule.paused and schedule.next_fire_at is None
    assert schedules.pause_schedule(schedule_id=schedule.id, user=olive)[1] is False
    assert schedules.fire_due(now=_at(5, 0)).schedules == 0
    assert schedules.next_fire_times(schedule) == []

    schedule, changed = schedules.resume_schedule(
        schedule_id=schedule.id, user=olive, now=_at(5, 10)
    )
    assert changed and schedule.next_fire_at == _at(6)
    assert schedules.fire_due(now=_at(6, 1)).outcomes == {"admitted": 1}
    assert _keys(schedule) == [f"schedule:{schedule.id}:2026-12-07T12:06:00Z"]


def test_the_slot_history_is_bounded(make_endpoint, olive, settings):
    settings.SCHEDULE_SLOT_HISTORY = 3
    schedule = _every(make_endpoint, olive, catch_up="all")
    for minute in range(1, 8):
        schedules.fire_due(now=_at(minute, 1))
    kept = list(ScheduleSlot.objects.filter(schedule=schedule).values_list("slot_at", flat=True))
    assert kept == [_at(5), _at(6), _at(7)]
    assert len(_keys(schedule)) == 7  # the tickets stay


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"cron": "61 * * * *"}, "cron '61 \\* \\* \\* \\*' is not valid"),
        ({"cron": "0 0 30 2 *"}, "is not valid"),
        ({"cron": "* * * * *", "every_s": 60}, "exactly one of cron and every_s"),
        ({}, "exactly one of cron and every_s"),
        ({"every_s": 30}, "at least 60"),
        ({"cron": "* * * * * *"}, "1 s apart; slots must be at least 60 s apart"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "not an IANA time zone"),
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "not an IANA time zone"),
    ],
)
def test_invalid_timings_are_refused_with_a_clear_detail(
    make_endpoint, olive, settings, spec, message
):
    settings.SCHEDULE_MIN_INTERVAL_S = 60
    make_endpoint("sched", owners=["olive"])
    with pytest.raises(Invalid, match=message):
        schedules.create_schedule(user=olive, endpoint="sched", input={}, **spec)
    assert not Schedule.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_firing_passes_make_one_ticket_per_slot(make_endpoint, olive):
    """Eight passes at once (two control workers, a duplicated beat), on a
    barrier, at the same moment and at moments a second apart, then one
    more tick: one ticket and one slot record per slot, and no slot missed."""
    schedule = _every(make_endpoint, olive, every_s=1, catch_up="all")
    start = schedule.next_fire_at
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def fire(offset: int) -> None:
        try:
            for step in range(5):
                barrier.wait(timeout=30)
                schedules.fire_due(now=start + timedelta(seconds=step * 3 + offset % 2))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=fire, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    # A pass skips a schedule another pass holds (SKIP LOCKED, no waiting):
    # the slot it would have fired is the next tick's.
    last = start + timedelta(seconds=13)
    schedules.fire_due(now=last)
    keys = _keys(schedule)
    expected = [schedules.slot_key(schedule.id, start + timedelta(seconds=s)) for s in range(14)]
    assert sorted(keys) == sorted(expected)
    slots = list(ScheduleSlot.objects.filter(schedule=schedule).values_list("slot_at", "outcome"))
    assert len(slots) == 14 and {o for _, o in slots} == {"admitted"}
    schedule.refresh_from_db()
    assert schedule.last_slot_at == last


# --- The API ----------------------------------------------------------------------------------


@pytest.fixture
def clients(api, olive, django_user_model):
    django_user_model.objects.create_user("mallory")
    return {
        "olive": api.as_key(create_api_key(username="olive")[1]),
        "mallory": api.as_key(create_api_key(username="mallory")[1]),
        "staff": api,
    }


def test_owners_and_staff_manage_schedules_and_strangers_see_none(make_endpoint, clients, client):
    make_endpoint("sched", owners=["olive"])
    body = {"endpoint": "sched", "every_s": 60, "input": {"q": 1}, "catch_up": "latest"}

    refused = clients["mallory"].post("/schedules", body)
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert clients["olive"].post("/schedules", {**body, "endpoint": "nope"}).status_code == 404

    created = clients["olive"].post("/schedules", body)
    assert created.status_code == 201, created.content
    s = created.json()
    assert s["endpoint"] == "sched" and s["catch_up"] == "latest" and not s["paused"]
    assert len(s["next_fire_times"]) == 3 and s["next_fire_times"][0] == s["next_fire_at"]
    assert s["created_by"] == "olive" and s["recent_slots"] == []
    assert clients["staff"].post("/schedules", {**body, "paused": True}).status_code == 201

    sid = s["id"]
    for path in (f"/schedules/{sid}", "/schedules/not-a-uuid"):
        gone = clients["mallory"].get(path)
        assert gone.status_code == 404 and gone.json()["error"] == "not_found"
    assert clients["mallory"].post(f"/schedules/{sid}/pause").status_code == 404
    assert clients["mallory"].get("/schedules").json() == []
    assert len(clients["olive"].get("/schedules").json()) == 2
    assert clients["staff"].get(f"/schedules/{sid}").status_code == 200

    paused = clients["olive"].post(f"/schedules/{sid}/pause").json()
    assert paused["paused"] and paused["changed"] and paused["next_fire_times"] == []
    assert clients["olive"].post(f"/schedules/{sid}/pause").json()["changed"] is False
    resumed = clients["staff"].post(f"/schedules/{sid}/resume").json()
    assert not resumed["paused"] and resumed["changed"] and resumed["next_fire_at"]

    mallory = f"Bearer {clients['mallory'].key}"
    assert client.delete(f"/api/v1/schedules/{sid}", HTTP_AUTHORIZATION=mallory).status_code == 404
    assert clients["olive"].get(f"/schedules/{sid}").status_code == 200


def test_deleting_a_schedule_keeps_its_tickets(make_endpoint, clients, client, olive):
    schedule = _every(make_endpoint, olive)
    schedules.fire_due(now=_at(1, 1))
    key = clients["olive"].key
    gone = client.delete(f"/api/v1/schedules/{schedule.id}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert gone.status_code == 200 and gone.json()["next_fire_times"] == []
    assert not Schedule.objects.exists() and not ScheduleSlot.objects.exists()
    assert len(_keys(schedule)) == 1
    again = client.delete(f"/api/v1/schedules/{schedule.id}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("change", "status", "detail"),
    [
        ({"cron": "bad cron"}, 400, "not valid"),
        ({"timezone": "Nowhere/Else"}, 400, "not an IANA time zone"),
        ({"every_s": 60}, 400, "exactly one of cron and every_s"),
        ({"cron": None}, 400, "exactly one of cron and every_s"),
        ({"catch_up": "some"}, 422, "catch_up"),
        ({"every_s": "60", "cron": None}, 422, "every_s"),
        ({"surprise": 1}, 422, "surprise"),
    ],
)
def test_the_api_refuses_bad_schedules_with_invalid(make_endpoint, clients, change, status, detail):
    make_endpoint("sched", owners=["olive"])
    body = {"endpoint": "sched", "cron": "0 9 * * 1", "input": {}, **change}
    answer = clients["olive"].post("/schedules", body)
    assert answer.status_code == status, answer.content
    assert answer.json()["error"] == "invalid" and detail in answer.json()["detail"]


def test_a_slots_ticket_shows_in_the_schedule(make_endpoint, clients, olive):
    schedule = _every(make_endpoint, olive)
    schedules.fire_due(now=_at(1, 1))
    (ticket,) = Ticket.objects.all()
    got = clients["olive"].get(f"/schedules/{schedule.id}").json()
    assert got["recent_slots"] == [
        {
            "slot": "2026-12-07T12:01:00Z",
            "outcome": "admitted",
            "ticket": str(ticket.id),
            "detail": {"key": ticket.dedupe_key},
            "at": "2026-12-07T12:01:01Z",
        }
    ]
    assert got["last_slot_at"] == "2026-12-07T12:01:00Z"


def test_a_schedule_whose_creator_is_gone_refuses_its_slots(make_endpoint, olive):
    schedule = _every(make_endpoint, olive)
    olive.delete()
    assert schedules.fire_due(now=_at(1, 1)).outcomes == {"refused": 1}
    assert ScheduleSlot.objects.get(schedule=schedule).detail["error"] == "forbidden"


def test_cancelling_a_slots_ticket_does_not_fire_the_slot_again(make_endpoint, olive):
    _every(make_endpoint, olive)
    schedules.fire_due(now=_at(1, 1))
    (ticket,) = Ticket.objects.all()
    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="not this week")
    assert schedules.fire_due(now=_at(1, 40)).schedules == 0
    assert Ticket.objects.count() == 1


def test_readiness_holds_the_schedules_tick_to_the_common_sweep_period(settings):
    """Beat ticks the schedules every SCHEDULE_TICK_S (1 s), but /readyz
    allows it three of the common SWEEP_INTERVAL_S: a webhook attempt on the
    control process must not make a healthy deployment unready."""
    from django.utils import timezone

    from health.checks import check_sweeps
    from health.models import SweepRun

    settings.SCHEDULE_TICK_S, settings.SWEEP_INTERVAL_S = 1.0, 5.0
    now = timezone.now()
    SweepRun.objects.create(name="schedules", last_finished_at=now - timedelta(seconds=6))
    (check,) = [c for c in check_sweeps(now=now) if c.name == "sweep:schedules"]
    assert check.ok and check.data["max_age_s"] == 15
