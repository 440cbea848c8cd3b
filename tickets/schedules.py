"""Schedules: every write of a schedule and its slots, and the firing pass
beat runs (docs/howto/schedules.md).

A schedule names an endpoint, a cron expression (in its ``timezone``) or a
period ``every_s`` (aligned to the Unix epoch: every 3600 s fires on the UTC
hour), an input and a catch-up policy. Each slot is admitted as the
schedule's creator with the dedupe key ``schedule:<id>:<slot, ISO 8601 UTC>``,
so a duplicated or restarted beat, or two control workers, converge on one
ticket per slot whatever else goes wrong: exactly once by construction, not
by the firing pass being unique.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.db import transaction
from django.utils import timezone as dj_timezone

from core.errors import DomainError, Forbidden, Invalid, NotFound
from core.times import iso
from core.transient import TRANSIENT_ERRORS
from endpoints.selectors import is_owner, owned_endpoint_ids, resolve_endpoint

from .admission import admit_ticket
from .schedule_models import CRON_CHARS, CatchUp, Schedule, ScheduleSlot, SlotOutcome

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The gaps checked against SCHEDULE_MIN_INTERVAL_S: between this many of a
# cron's next slots (a cron's gaps vary: "0,1 * * * *").
_GAPS_CHECKED = 12
# A cron with no slot in this many years never fires ("0 0 29 2 1" is rare,
# not never): refused when created.
_HORIZON_YEARS = 30


# --- Slots ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """When a schedule fires: one of ``cron`` and ``every_s``, and the zone a
    cron is read in."""

    cron: str
    every_s: int | None
    tz: ZoneInfo

    @classmethod
    def of(cls, schedule: Schedule) -> Spec:
        return cls(cron=schedule.cron, every_s=schedule.every_s, tz=ZoneInfo(schedule.timezone))

    def after(self, moment: datetime) -> Iterator[datetime]:
        """The slots strictly after ``moment``, oldest first, in UTC, whole seconds."""
        if self.every_s:
            k = int((moment - EPOCH).total_seconds() // self.every_s) + 1
            while True:
                yield EPOCH + timedelta(seconds=k * self.every_s)
                k += 1
        else:
            horizon = moment + timedelta(days=366 * _HORIZON_YEARS)
            for slot in CronSim(self.cron, moment.astimezone(self.tz)):
                slot = slot.astimezone(UTC)
                if slot > horizon:
                    return
                yield slot

    def until(self, moment: datetime) -> Iterator[datetime]:
        """The slots at or before ``moment``, newest first."""
        moment = moment.replace(microsecond=0)
        if self.every_s:
            k = int((moment - EPOCH).total_seconds() // self.every_s)
            while k >= 0:
                yield EPOCH + timedelta(seconds=k * self.every_s)
                k -= 1
        else:
            # CronSim's reverse starts strictly before its moment.
            start = (moment + timedelta(seconds=1)).astimezone(self.tz)
            for slot in CronSim(self.cron, start, reverse=True):
                yield slot.astimezone(UTC)

    def next_slot(self, moment: datetime) -> datetime | None:
        return next(self.after(moment), None)

    def count(self, first: datetime, last: datetime, *, cap: int) -> tuple[int, bool]:
        """How many slots lie in [first, last] (both slots), and whether the
        count stopped at ``cap`` (a cron's are counted one by one)."""
        if last < first:
            return 0, False
        if self.every_s:
            return int((last - first).total_seconds() // self.every_s) + 1, False
        n = 0
        for slot in self.after(first - timedelta(seconds=1)):
            if slot > last:
                return n, False
            n += 1
            if n >= cap:
                return n, True
        return n, False


def slot_key(schedule_id: uuid.UUID, slot: datetime) -> str:
    """The slot's dedupe key (API.md "Schedules")."""
    return f"schedule:{schedule_id}:{iso(slot.astimezone(UTC))}"


@functools.cache
def _zones() -> frozenset[str]:
    """The IANA zone names this host knows (a scan of the zone files: once),
    less the host-dependent aliases some systems list among them."""
    return frozenset(available_timezones()) - {"localtime", "posixrules", "Factory"}


def validate_spec(*, cron: str | None, every_s: int | None, tz_name: str | None) -> Spec:
    """The schedule's timing, or 400 ``invalid`` saying what is wrong."""
    cron = (cron or "").strip()
    if bool(cron) == (every_s is not None):
        raise Invalid("give exactly one of cron and every_s")
    tz_name = tz_name or "UTC"
    try:
        if tz_name not in _zones():
            raise ZoneInfoNotFoundError(tz_name)
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise Invalid(f"timezone {tz_name!r} is not an IANA time zone (Europe/Berlin)") from None
    minimum = settings.SCHEDULE_MIN_INTERVAL_S
    if every_s is not None:
        if isinstance(every_s, bool) or not isinstance(every_s, int) or every_s < minimum:
            raise Invalid(f"every_s must be a whole number of seconds, at least {minimum}")
        if every_s > 366 * 86400:
            raise Invalid("every_s must be at most a year (366 days); use cron for rarer slots")
        return Spec(cron="", every_s=every_s, tz=tz)
    if len(cron) > CRON_CHARS or not cron.isprintable():
        raise Invalid(f"cron must be at most {CRON_CHARS} printable characters")
    try:
        spec = Spec(cron=" ".join(cron.split()), every_s=None, tz=tz)
        slots = []
        for slot in spec.after(dj_timezone.now()):
            slots.append(slot)
            if len(slots) > _GAPS_CHECKED:
                break
    except CronSimError as exc:
        raise Invalid(f"cron {cron!r} is not valid: {exc}") from None
    if not slots:
        raise Invalid(f"cron {cron!r} has no slot in the next {_HORIZON_YEARS} years")
    gaps = [(b - a).total_seconds() for a, b in zip(slots, slots[1:], strict=False)]
    if gaps and min(gaps) < minimum:
        raise Invalid(
            f"cron {cron!r} fires {min(gaps):g} s apart; slots must be at least "
            f"{minimum} s apart (SCHEDULE_MIN_INTERVAL_S)"
        )
    return spec


# --- Who may ------------------------------------------------------------------------------------


def visible_schedules(user):
    """The schedules ``user`` may see: those of endpoints they own; all for staff."""
    owned = owned_endpoint_ids(user)
    schedules = Schedule.objects.select_related("endpoint", "created_by")
    return schedules if owned is None else schedules.filter(endpoint_id__in=owned)


def list_visible(*, user, endpoint: str | None = None, limit: int = 50) -> list[Schedule]:
    """The user's visible schedules, oldest first; ``endpoint`` (an address or
    alias; unknown: 404) narrows them to one endpoint's."""
    found = visible_schedules(user)
    if endpoint:
        found = found.filter(endpoint=resolve_endpoint(endpoint))
    return list(found.order_by("created_at", "id")[:limit])


def get_visible_schedule(schedule_id: uuid.UUID | str, *, user) -> Schedule:
    """A schedule the user may see; anyone else's (or an unknown id) is 404."""
    try:
        key = uuid.UUID(str(schedule_id))
    except ValueError:
        raise NotFound(f"schedule {schedule_id} not found") from None
    schedule = visible_schedules(user).filter(id=key).first()
    if schedule is None:
        raise NotFound(f"schedule {schedule_id} not found")
    return schedule


# --- Writes -------------------------------------------------------------------------------------


def create_schedule(
    *,
    user,
    endpoint: str,
    input: dict[str, Any],  # noqa: A002 - the contract's name
    cron: str | None = None,
    every_s: int | None = None,
    timezone: str | None = None,
    catch_up: str = CatchUp.NONE,
    paused: bool = False,
    now: datetime | None = None,
) -> Schedule:
    """A new schedule of ``endpoint`` (address or alias), by its owners or
    staff (403 for anyone else). Its first slot is the first after now;
    created paused, it has none until resumed."""
    target = resolve_endpoint(endpoint)
    if not is_owner(user, target):
        raise Forbidden(f"only the owners of {target.address} (or staff) may schedule it")
    spec = validate_spec(cron=cron, every_s=every_s, tz_name=timezone)
    if catch_up not in CatchUp.values:
        raise Invalid(f"catch_up must be one of {', '.join(CatchUp.values)}")
    if not isinstance(input, dict):
        raise Invalid("input must be a JSON object")
    _check_input_size(input)
    now = now or dj_timezone.now()
    next_fire_at = None if paused else spec.next_slot(now)
    schedule = Schedule.objects.create(
        endpoint=target,
        cron=spec.cron,
        every_s=spec.every_s,
        timezone=spec.tz.key,
        input=input,
        catch_up=catch_up,
        paused=paused,
        next_fire_at=next_fire_at,
        created_by=user,
        created_at=now,
        updated_at=now,
    )
    log.info(
        "schedule %s of %s created by %s (%s, catch_up %s%s)",
        schedule.id,
        target.address,
        user.username,
        f"cron {spec.cron!r} in {spec.tz.key}" if spec.cron else f"every {spec.every_s} s",
        catch_up,
        ", paused" if paused else "",
    )
    return schedule


def _check_input_size(input: dict[str, Any]) -> None:  # noqa: A002
    from core.canonical import canonical_json
    from core.errors import TooLarge

    size = len(canonical_json(input))
    if size > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge(
            f"input is {size} bytes; the cap is {settings.TICKET_MAX_INPUT_BYTES}",
            limit=settings.TICKET_MAX_INPUT_BYTES,
        )


def pause_schedule(*, schedule_id: uuid.UUID | str, user) -> tuple[Schedule, bool]:
    """Pause: no slot fires until resumed (and the slots in between never
    do). Returns the schedule and whether this call changed it (pausing a
    paused schedule changes nothing)."""
    schedule = get_visible_schedule(schedule_id, user=user)
    changed = Schedule.objects.filter(id=schedule.id, paused=False).update(
        paused=True, next_fire_at=None, updated_at=dj_timezone.now()
    )
    if changed:
        log.info("schedule %s paused by %s", schedule.id, user.username)
    return get_visible_schedule(schedule.id, user=user), bool(changed)


def resume_schedule(
    *, schedule_id: uuid.UUID | str, user, now: datetime | None = None
) -> tuple[Schedule, bool]:
    """Resume: the next slot is the first after now; the slots that passed
    while paused are not caught up (a pause is a decision, not an outage)."""
    schedule = get_visible_schedule(schedule_id, user=user)
    now = now or dj_timezone.now()
    next_at = Spec.of(schedule).next_slot(now)
    if next_at is None:
        raise Invalid(f"schedule {schedule.id} has no slot left in the next {_HORIZON_YEARS} years")
    changed = Schedule.objects.filter(id=schedule.id, paused=True).update(
        paused=False, next_fire_at=next_at, updated_at=now
    )
    if changed:
        log.info("schedule %s resumed by %s", schedule.id, user.username)
    return get_visible_schedule(schedule.id, user=user), bool(changed)


def delete_schedule(*, schedule_id: uuid.UUID | str, user) -> Schedule:
    """Delete the schedule and its slot records; its tickets stay. A firing
    pass holding the row finishes first (the lock), so no slot is half done."""
    schedule = get_visible_schedule(schedule_id, user=user)
    with transaction.atomic():
        locked = Schedule.objects.select_for_update().filter(id=schedule.id).first()
        if locked is None:
            raise NotFound(f"schedule {schedule_id} not found")
        ScheduleSlot.objects.filter(schedule_id=schedule.id).delete()
        Schedule.objects.filter(id=schedule.id).delete()
    log.info(
        "schedule %s of %s deleted by %s", schedule.id, schedule.endpoint.address, user.username
    )
    # As it was, with nothing left to fire: its payload shows no next slots.
    schedule.paused, schedule.next_fire_at = True, None
    return schedule


# --- Firing -------------------------------------------------------------------------------------


@dataclass
class Fired:
    """What one pass did, by outcome (slots) and schedules handled."""

    schedules: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


def fire_due(*, now: datetime | None = None, limit: int | None = None) -> Fired:
    """One firing pass (beat's "schedules" sweep): every unpaused schedule
    whose next slot is due, each in its own transaction (``fire_schedule``).
    Schedules another pass holds are skipped, not waited for."""
    now = now or dj_timezone.now()
    limit = limit or settings.SCHEDULE_BATCH
    report = Fired()
    due = list(
        Schedule.objects.filter(paused=False, next_fire_at__lte=now)
        .order_by("next_fire_at")
        .values_list("id", flat=True)[:limit]
    )
    for schedule_id in due:
        try:
            if fire_schedule(schedule_id=schedule_id, now=now, report=report):
                report.schedules += 1
        except TRANSIENT_ERRORS:
            raise  # the sweep logs it once; the next tick does it all again
        except Exception:
            # One schedule's fault (rolled back whole) must not stop the others.
            log.exception("schedule %s: firing failed; the next pass tries again", schedule_id)
            report.add("failed")
    return report


def fire_schedule(
    *, schedule_id: uuid.UUID, now: datetime | None = None, report: Fired | None = None
) -> bool:
    """Admit the due slots of one schedule. One transaction:

    1. Lock the row ``FOR UPDATE SKIP LOCKED``, if it is still unpaused and
       due (a concurrent pass holding it, or one that just committed and
       moved ``next_fire_at`` past now, makes this a no-op: False).
    2. The due slots are those in [next_fire_at, now]; the catch-up policy
       picks the ones that fire (``_plan``), the rest are one ``skipped``
       record naming how many and which.
    3. Admit each, oldest first, as the creator with the slot's dedupe key.
       A refusal (quarantined, forbidden, over a cap ...) is the slot's
       outcome, recorded, never retried; a duplicate is the slot's ticket.
    4. Record the outcomes (one row per slot, unique per slot) and move
       ``next_fire_at``/``last_slot_at`` with a compare-and-set on the
       values read in step 1; trim the slot history.

    A transient database fault rolls the whole schedule back; the next pass
    does it again and the dedupe keys find the tickets already admitted.
    """
    now = now or dj_timezone.now()
    report = report if report is not None else Fired()
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(id=schedule_id, paused=False, next_fire_at__lte=now)
            .first()
        )
        if schedule is None:
            return False
        spec = Spec.of(schedule)
        fire, skipped = _plan(schedule, spec, now)
        rows: list[ScheduleSlot] = []
        if skipped is not None:
            rows.append(skipped)
        for slot in fire:
            rows.append(_admit_slot(schedule, slot, now))
        ScheduleSlot.objects.bulk_create(rows, ignore_conflicts=True)
        # No row: next_fire_at was no slot of the spec (cannot happen as it
        # is only ever set from one); move on from now all the same.
        newest = max((r.slot_at for r in rows), default=None)
        next_at = spec.next_slot(max(now, newest or now))
        if next_at is None:  # a cron with no slot left in the horizon
            log.warning("schedule %s has no further slot: paused", schedule.id)
        moved = Schedule.objects.filter(
            id=schedule.id, paused=False, next_fire_at=schedule.next_fire_at
        ).update(
            next_fire_at=next_at,
            paused=next_at is None,
            last_slot_at=newest or schedule.last_slot_at,
            updated_at=now,
        )
        if not moved:  # the row lock makes this unreachable; say so loudly if not
            raise RuntimeError(f"schedule {schedule.id} changed under its row lock")
        _trim(schedule.id)
    # Counted once committed: a pass rolled back did nothing.
    for row in rows:
        report.add(row.outcome, row.detail.get("skipped", 1) if row.outcome == "skipped" else 1)
    return True


def _plan(
    schedule: Schedule, spec: Spec, now: datetime
) -> tuple[list[datetime], ScheduleSlot | None]:
    """The slots that fire now (oldest first) and the record of those
    skipped, by the schedule's catch-up policy. Reads at most
    ``SCHEDULE_MAX_CATCH_UP`` + 1 slots newest first, so a long outage costs
    no more than a short one."""
    first = schedule.next_fire_at
    if schedule.catch_up == CatchUp.ALL:
        wanted = settings.SCHEDULE_MAX_CATCH_UP
        oldest_allowed = first
    elif schedule.catch_up == CatchUp.LATEST:
        wanted = 1
        oldest_allowed = first
    else:
        wanted = settings.SCHEDULE_MAX_CATCH_UP
        oldest_allowed = max(first, now - timedelta(seconds=settings.SCHEDULE_GRACE_S))
    fire: list[datetime] = []
    for slot in spec.until(now):
        if slot < oldest_allowed or len(fire) >= wanted:
            break
        fire.append(slot)
    fire.reverse()
    last_skipped = None
    for slot in spec.until((fire[0] - timedelta(seconds=1)) if fire else now):
        last_skipped = slot if slot >= first else None
        break
    if last_skipped is None:
        return fire, None
    n, capped = spec.count(first, last_skipped, cap=10 * settings.SCHEDULE_MAX_CATCH_UP)
    log.warning(
        "schedule %s skipped %s%d missed slot(s) from %s to %s (catch_up %s)",
        schedule.id,
        "at least " if capped else "",
        n,
        iso(first),
        iso(last_skipped),
        schedule.catch_up,
    )
    skipped = ScheduleSlot(
        schedule_id=schedule.id,
        slot_at=last_skipped,
        outcome=SlotOutcome.SKIPPED,
        detail={
            "skipped": n,
            "at_least": capped,
            "from": iso(first),
            "to": iso(last_skipped),
            "catch_up": schedule.catch_up,
        },
        at=now,
    )
    return fire, skipped


def _admit_slot(schedule: Schedule, slot: datetime, now: datetime) -> ScheduleSlot:
    key = slot_key(schedule.id, slot)
    record = ScheduleSlot(schedule_id=schedule.id, slot_at=slot, at=now, detail={"key": key})
    creator = schedule.created_by
    if creator is None or not creator.is_active:
        record.outcome = SlotOutcome.REFUSED
        record.detail.update(error="forbidden", reason="the schedule's creator is gone or inactive")
        log.warning("schedule %s slot %s refused: its creator is gone", schedule.id, iso(slot))
        return record
    try:
        admitted = admit_ticket(
            endpoint=schedule.endpoint.address,
            input=schedule.input,
            dedupe_key=key,
            submitter=creator,
            requester={
                "name": f"schedule {schedule.id}",
                "metadata": {"schedule": str(schedule.id), "slot": iso(slot)},
            },
            actor=f"schedule:{schedule.id}",
        )
    except DomainError as exc:
        record.outcome = SlotOutcome.REFUSED
        record.detail.update(error=exc.code, reason=exc.detail)
        log.warning(
            "schedule %s slot %s refused by admission: %s (%s)",
            schedule.id,
            iso(slot),
            exc.code,
            exc.detail,
        )
        return record
    record.ticket_id = admitted.ticket.id
    record.outcome = SlotOutcome.DUPLICATE if admitted.duplicate else SlotOutcome.ADMITTED
    return record


def _trim(schedule_id: uuid.UUID) -> None:
    """Keep the newest SCHEDULE_SLOT_HISTORY slot records (the unique
    index on (schedule, slot_at) serves both queries)."""
    keep = settings.SCHEDULE_SLOT_HISTORY
    cutoff = (
        ScheduleSlot.objects.filter(schedule_id=schedule_id)
        .order_by("-slot_at")
        .values_list("slot_at", flat=True)[keep : keep + 1]
        .first()
    )
    if cutoff is not None:
        ScheduleSlot.objects.filter(schedule_id=schedule_id, slot_at__lte=cutoff).delete()


# --- Reads --------------------------------------------------------------------------------------


def next_fire_times(schedule: Schedule, n: int = 3) -> list[datetime]:
    """The schedule's next ``n`` slots (none while paused)."""
    if schedule.paused or schedule.next_fire_at is None:
        return []
    times = [schedule.next_fire_at]
    for slot in Spec.of(schedule).after(schedule.next_fire_at):
        if len(times) >= n:
            break
        times.append(slot)
    return times


def recent_slots(schedule: Schedule, limit: int = 10) -> list[ScheduleSlot]:
    """The newest slot records, newest first."""
    return list(ScheduleSlot.objects.filter(schedule_id=schedule.id).order_by("-slot_at")[:limit])


def schedule_payload(schedule: Schedule, *, slots: int = 10) -> dict[str, Any]:
    """The schedule as the API shows it to its endpoint's owners and staff."""
    return {
        "id": str(schedule.id),
        "endpoint": schedule.endpoint.address,
        "cron": schedule.cron or None,
        "every_s": schedule.every_s,
        "timezone": schedule.timezone,
        "input": schedule.input,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "next_fire_at": iso(schedule.next_fire_at),
        "next_fire_times": [iso(t) for t in next_fire_times(schedule)],
        "last_slot_at": iso(schedule.last_slot_at),
        "created_by": schedule.created_by.username if schedule.created_by else None,
        "created_at": iso(schedule.created_at),
        "updated_at": iso(schedule.updated_at),
        "recent_slots": [
            {
                "slot": iso(s.slot_at),
                "outcome": s.outcome,
                "ticket": str(s.ticket_id) if s.ticket_id else None,
                "detail": s.detail,
                "at": iso(s.at),
            }
            for s in recent_slots(schedule, limit=slots)
        ],
    }
