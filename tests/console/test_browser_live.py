"""Live regions in a real browser wake on a notification (issue 12): with
the timers at their production periods (a 60 s safety refresh; 5 s and 10 s
only where watching is unavailable), a change shows within a second or two
and an idle page makes no region request at all (console/views/live.py)."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from runtime import services as runtime_services
from tests.conftest import listener_wakeups
from tickets.admission import admit_ticket

from .helpers import echo_endpoint
from .test_browser import PASSWORD, browser, log_in, page  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def production_periods(settings):
    settings.CONSOLE_REFRESH_S = None


def region_requests(page) -> list[str]:
    """The htmx region requests (refreshes) and the watches, from now on."""
    seen: list[str] = []
    page.on(
        "request",
        lambda r: (
            seen.append(("watch " if "/live/" in r.url else "region ") + r.url)
            if r.headers.get("hx-request") or "/live/" in r.url
            else None
        ),
    )
    return seen


def test_the_ticket_page_shows_a_change_at_once_and_is_quiet_meanwhile(page, live_server, settings):
    settings.CONSOLE_LIVE_WAIT_S = 2  # a few watch cycles while the page idles
    echo_endpoint("web.live")
    ticket = admit_ticket(endpoint="web.live", input={"q": "watch"}).ticket
    create_owner(username="olive", password=PASSWORD, endpoints=["web.live"])
    log_in(page, live_server, f"/tickets/{ticket.id}/", "olive", PASSWORD)
    state = page.locator("#ticket dl.kv").first
    expect(state).to_contain_text("queued")
    seen = region_requests(page)
    page.wait_for_function(
        "() => document.getElementById('ticket').claimcheckWatch", timeout=5_000
    )  # watching: a request waits on the server
    heard_at = page.locator("#live-updated-at").get_attribute("datetime")
    # Four more watches answered "unchanged", three of them after the whole
    # 2 s the server waits: longer than the old 5 s poll has passed.
    answered = (
        "() => performance.getEntriesByType('resource')"
        ".filter((e) => e.name.includes('/live/')).length"
    )
    page.wait_for_function(f"() => ({answered})() >= {page.evaluate(answered) + 4}", timeout=30_000)
    assert [s for s in seen if s.startswith("region")] == [], seen
    assert len([s for s in seen if s.startswith("watch")]) >= 2, seen
    # Each watch that found nothing changed says the page is current.
    assert page.locator("#live-updated-at").get_attribute("datetime") > heard_at

    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="changed elsewhere")
    changed = time.monotonic()
    expect(state).to_contain_text("cancelled", timeout=4_000)
    assert time.monotonic() - changed < 4
    assert len([s for s in seen if s.startswith("region")]) == 1, seen
    # A finished ticket holds still: nothing watches it any more.
    expect(page.locator("[data-live-watch]")).to_have_count(0)
    page.wait_for_function("() => !document.getElementById('ticket').claimcheckWatch")


def test_the_dashboard_shows_a_new_ticket_without_waiting_for_a_timer(page, live_server):
    echo_endpoint("web.dash")
    create_owner(username="olive", password=PASSWORD, endpoints=["web.dash"])
    log_in(page, live_server, "/", "olive", PASSWORD)
    page.wait_for_function("() => document.getElementById('live').claimcheckWatch", timeout=5_000)
    ticket = admit_ticket(endpoint="web.dash", input={"q": "new"}).ticket
    expect(page.locator("#live")).to_contain_text(str(ticket.id)[-8:], timeout=4_000)


def test_paused_refresh_watches_nothing(page, live_server):
    echo_endpoint("web.pause")
    ticket = admit_ticket(endpoint="web.pause", input={"q": "held"}).ticket
    create_owner(username="olive", password=PASSWORD, endpoints=["web.pause"])
    log_in(page, live_server, f"/tickets/{ticket.id}/", "olive", PASSWORD)
    page.wait_for_function("() => document.getElementById('ticket').claimcheckWatch")
    page.get_by_role("button", name="Live refresh: on").click()
    page.wait_for_function("() => !document.getElementById('ticket').claimcheckWatch")
    seen = region_requests(page)
    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="while paused")
    # The live server (this process) hears the cancel and then three more
    # notifications, each handed on in order: a watch still open would have
    # been answered "changed" and the page would have asked for the region.
    listener_wakeups(3)
    page.evaluate("() => new Promise((r) => setTimeout(r, 0))")  # the page's pending callbacks ran
    assert seen == [] and "queued" in page.locator("#ticket dl.kv").first.inner_text()
    page.get_by_role("button", name="Live refresh: paused").click()
    # Back on: the watch finds the token stale at once and the page catches up.
    expect(page.locator("#ticket dl.kv").first).to_contain_text("cancelled", timeout=4_000)
