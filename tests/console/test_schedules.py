"""The endpoint page's schedules panel: next fire times and each recent
slot's ticket, for the endpoint's owners and staff only."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console.owners import create_owner
from tickets import schedules
from tickets.models import Ticket

from .helpers import echo_endpoint

pytestmark = pytest.mark.django_db


def test_owners_see_next_fire_times_and_each_slots_ticket(client, django_user_model):
    echo_endpoint("con.weekly")
    olive = create_owner(username="olive", password="pw-olive-1", endpoints=["con.weekly"])
    mallory = django_user_model.objects.create_user("mallory")
    schedule = schedules.create_schedule(
        user=olive,
        endpoint="con.weekly",
        cron="0 9 * * 1",
        timezone="Europe/Berlin",
        input={"topic": "agents"},
        now=datetime(2026, 12, 1, tzinfo=UTC),
    )
    schedules.fire_due(now=datetime(2026, 12, 7, 8, 0, 5, tzinfo=UTC))
    (ticket,) = Ticket.objects.filter(dedupe_key__startswith=f"schedule:{schedule.id}:")

    client.force_login(olive)
    page = client.get("/endpoints/con.weekly/").content.decode()
    assert 'id="schedules"' in page and "0 9 * * 1" in page
    assert "2026-12-14 08:00" in page  # the next Monday 09:00 in Berlin, shown in UTC
    assert f'href="/tickets/{ticket.id}/"' in page

    client.force_login(mallory)
    page = client.get("/endpoints/con.weekly/").content.decode()
    assert 'id="schedules"' not in page and str(ticket.id) not in page


def test_the_seed_schedules_the_weekly_brief_once(settings, tmp_path):
    import io

    from django.core.management import call_command

    from tickets.models import Schedule

    settings.VAR_DIR = tmp_path
    for _ in range(2):
        call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    (brief,) = Schedule.objects.all()
    assert (brief.endpoint.address, brief.cron, brief.paused) == (
        "demo.research",
        "0 9 * * 1",
        False,
    )
    assert brief.created_by.username == "demo" and brief.next_fire_at.weekday() == 0
