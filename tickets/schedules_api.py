"""Schedule routes (API.md "Schedules", docs/howto/schedules.md): parse, call one
service in tickets/schedules.py, render. The endpoint's owners and staff
only; anyone else's schedule is 404, creating one for an endpoint they do
not own is 403."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Status

from core import limits
from core.schemas import Out, Strict

from . import schedules
from .schedule_models import CRON_CHARS

router = Router(tags=["schedules"])

LIST_LIMIT = 200


class ScheduleIn(Strict):
    endpoint: str = Field(min_length=1, max_length=limits.ADDRESS_CHARS)
    cron: str | None = Field(default=None, max_length=CRON_CHARS)
    every_s: int | None = Field(default=None, strict=True)
    timezone: str | None = Field(default=None, max_length=64)
    input: dict[str, Any] = Field(default_factory=dict)
    catch_up: Literal["none", "latest", "all"] = "none"
    paused: bool = Field(default=False, strict=True)


class SlotOut(Out):
    slot: str = Field(description="The slot's time (UTC); its ticket's dedupe key ends with it.")
    outcome: Literal["admitted", "duplicate", "refused", "skipped"]
    ticket: str | None
    detail: dict[str, Any]
    at: str


class ScheduleOut(Out):
    id: str
    endpoint: str
    cron: str | None
    every_s: int | None
    timezone: str
    input: dict[str, Any]
    catch_up: Literal["none", "latest", "all"]
    paused: bool
    next_fire_at: str | None
    next_fire_times: list[str] = Field(description="The next three slots (none while paused).")
    last_slot_at: str | None
    created_by: str | None
    created_at: str
    updated_at: str
    recent_slots: list[SlotOut] = Field(description="The newest slots, newest first.")


class ScheduleChangeOut(ScheduleOut):
    changed: bool


@router.post("", response={201: ScheduleOut})
def create_schedule(request: HttpRequest, payload: ScheduleIn):
    schedule = schedules.create_schedule(
        user=request.user,
        endpoint=payload.endpoint,
        cron=payload.cron,
        every_s=payload.every_s,
        timezone=payload.timezone,
        input=payload.input,
        catch_up=payload.catch_up,
        paused=payload.paused,
    )
    return Status(201, schedules.schedule_payload(schedule))


@router.get("", response=list[ScheduleOut])
def list_schedules(
    request: HttpRequest,
    endpoint: str | None = Query(None, max_length=limits.ADDRESS_CHARS),
    limit: int = Query(50, ge=1, le=LIST_LIMIT),
):
    """The caller's visible schedules (of endpoints they own; all for staff),
    oldest first."""
    found = schedules.list_visible(user=request.user, endpoint=endpoint, limit=limit)
    return [schedules.schedule_payload(s, slots=3) for s in found]


@router.get("/{schedule_id}", response=ScheduleOut)
def get_schedule(request: HttpRequest, schedule_id: str):
    return schedules.schedule_payload(
        schedules.get_visible_schedule(schedule_id, user=request.user)
    )


@router.post("/{schedule_id}/pause", response=ScheduleChangeOut)
def pause_schedule(request: HttpRequest, schedule_id: str):
    """No slot fires until resumed. Pausing a paused schedule answers
    ``changed: false``."""
    schedule, changed = schedules.pause_schedule(schedule_id=schedule_id, user=request.user)
    return {**schedules.schedule_payload(schedule), "changed": changed}


@router.post("/{schedule_id}/resume", response=ScheduleChangeOut)
def resume_schedule(request: HttpRequest, schedule_id: str):
    """The next slot is the first after now: slots that passed while paused
    never fire."""
    schedule, changed = schedules.resume_schedule(schedule_id=schedule_id, user=request.user)
    return {**schedules.schedule_payload(schedule), "changed": changed}


@router.delete("/{schedule_id}", response=ScheduleOut)
def delete_schedule(request: HttpRequest, schedule_id: str):
    """The schedule and its slot records go; its tickets stay. Answers the
    schedule as it was (no next fire times, no slots)."""
    schedule = schedules.delete_schedule(schedule_id=schedule_id, user=request.user)
    return schedules.schedule_payload(schedule)
