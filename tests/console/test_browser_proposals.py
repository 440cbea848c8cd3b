"""The proposals page in a real browser at 1280 and 390 px: reached from
the nav, filtered by state, each row leading to its review, fitting the
window."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.proposals import propose_change, review_proposal

from .helpers import echo_endpoint
from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def test_the_proposals_page_lists_filters_and_leads_to_the_review(page, live_server):
    echo_endpoint("web.gov")
    olive = create_owner(username="olive", password=PASSWORD, endpoints=["web.gov"])
    oscar = create_owner(username="oscar", password=PASSWORD, endpoints=["web.gov"])
    first = propose_change(
        address="web.gov",
        user=olive,
        base_generation=1,
        changes={"turn_budget_s": 12.0},
        reason="shorter turns after the stuck one",
    )
    review_proposal(proposal_id=first.id, user=oscar, approve=True, reason="agreed")
    waiting = propose_change(
        address="web.gov",
        user=olive,
        base_generation=2,
        changes={"notes": "Stop early when the provider is slow."},
        reason="a note for the next run",
    )
    log_in(page, live_server, "/", "oscar", PASSWORD)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/")
        page.get_by_role("navigation", name="Console").get_by_role("link", name="Proposals").click()
        expect(page).to_have_url(f"{live_server.url}/proposals/")
        # The rows are in the document before its deferred scripts run: htmx
        # handles the filter's change once DOMContentLoaded has fired.
        page.wait_for_load_state("domcontentloaded")
        rows = page.locator("#proposal-table tbody tr[data-status]")
        expect(rows).to_have_count(2)
        page.get_by_label("State").select_option("open")  # htmx swaps the table
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-status", "open")
        expect(page).to_have_url(f"{live_server.url}/proposals/?state=open")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        shot(page, f"proposals-{width}")
        rows.first.locator(f'a[href="/proposals/{waiting.id}/"]').click()
        expect(page).to_have_url(f"{live_server.url}/proposals/{waiting.id}/")
        expect(page.locator("#review")).to_be_visible()
    # Oscar approves it from there: the list shows it approved.
    page.get_by_label("Reason").fill("fine")
    page.get_by_role("button", name="Approve and apply").click()
    expect(page.locator("#proposal-status")).to_contain_text("approved")
    page.goto(f"{live_server.url}/proposals/?state=approved")
    expect(page.locator("#proposal-table tbody tr[data-status=approved]")).to_have_count(2)
