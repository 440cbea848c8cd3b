"""The case page after "stop the process", with a real worker and beat, in
a real browser at 1280 and 390 px: once the worker has killed the process
the page says so, without a reload; it no longer says the callable "still
runs in process N"."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from recovery import services as recovery
from recovery.models import RecoveryCase
from runtime.selectors import slot_holding
from tests.conftest import wait_for
from tickets.admission import admit_ticket

from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def test_the_case_page_stops_saying_the_process_runs_once_it_is_killed(
    celery_procs, make_endpoint, page, live_server
):
    celery_procs.control_and_beat()
    celery_procs.worker("turns", queues="turns", concurrency=1)
    olive = create_owner(username="olive", password=PASSWORD, endpoints=[])
    make_endpoint(
        "web.stuck",
        path="runtime.demo.stuck",
        owners=[olive.username],
        turn_budget_s=1,
        interrupt_grace_s=0.5,
    )
    stuck = admit_ticket(endpoint="web.stuck", input={"seconds": 300}).ticket
    case = wait_for(
        lambda: RecoveryCase.objects.filter(ticket=stuck).first(), timeout=30, message="quarantine"
    )
    inspection = recovery.inspect_case(case_id=case.id, user=olive)
    recovery.decide(
        case_id=case.id,
        user=olive,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="the callable never returns",
    )
    slot = wait_for(lambda: slot_holding(case.turn_id), timeout=10, message="the held slot")

    log_in(page, live_server, f"/recovery/{case.id}/", "olive", PASSWORD)
    panel = page.locator("#stop-process")
    expect(panel).to_contain_text(f"still runs in process {slot.pid}")
    panel.get_by_label("Rationale").fill("free the slot: the case is decided")
    page.on("dialog", lambda d: d.accept())
    panel.get_by_role("button", name="Stop the process").click()
    expect(page.locator("#messages")).to_contain_text("Stop requested")
    # No reload: the panel follows the stop to its outcome.
    expect(page.locator("#stop-process [data-stop=killed]")).to_contain_text(
        f"Stop of process {slot.pid}", timeout=30_000
    )
    expect(page.locator("#stop-process")).not_to_contain_text("still runs")
    expect(page.locator("#stop-process")).not_to_contain_text("waiting for worker")
    expect(page.locator("#stop-process[data-stop-pending]")).to_have_count(0)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        expect(page.locator("#stop-process [data-stop=killed]")).to_be_visible()
        expect(page.locator("#stop-process")).not_to_contain_text("still runs")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        shot(page, f"stop-process-{width}")
