"""The endpoint page fits a desktop and a phone, in a real browser at 1280
and 390 px: its recent turns (with an interrupt reason), its generations
(a diff in "What changed", a rollback form per earlier generation) and its
proposals never make the page scroll sideways, and the generations' "What
changed" cell keeps room for a diff."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.proposals import propose_change, review_proposal

from .helpers import quarantined_case
from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _busy_endpoint(address: str):
    """An endpoint as a first hour leaves it: an interrupted turn, three
    generations (a budget, a runner's settings and notes changed), the
    earlier ones each with a rollback form."""
    quarantined_case(address)
    olive = create_owner(username="olive", password=PASSWORD, endpoints=[address])
    oscar = create_owner(username="oscar", password=PASSWORD, endpoints=[address])
    for base, changes in (
        (1, {"turn_budget_s": 12.0, "interrupt_grace_s": 2.5}),
        (
            2,
            {
                "runner": {"kind": "python", "path": "runtime.demo.echo", "kill_after_s": 30},
                "notes": "Stop earlier: the provider times out after ten seconds on long briefs.",
            },
        ),
    ):
        proposal = propose_change(
            address=address,
            user=olive,
            base_generation=base,
            changes=changes,
            reason="shorter turns after the stuck one",
        )
        review_proposal(proposal_id=proposal.id, user=oscar, approve=True, reason="agreed")
    return olive


def test_the_endpoint_page_fits_a_desktop_and_a_phone(page, live_server):
    _busy_endpoint("web.wide")
    log_in(page, live_server, "/endpoints/web.wide/", "olive", PASSWORD)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        expect(page.locator("#generations tr[id^=generation-]")).to_have_count(3)
        shot(page, f"endpoint-width-{width}")
        scroll = page.evaluate("() => document.documentElement.scrollWidth")
        assert scroll <= width, f"the page is {scroll} px wide at {width}"
        # Every cell is inside the viewport: none is cut at the right edge.
        for selector in ("#live table.grid th", "#generations tr[id^=generation-] > td"):
            right = page.evaluate(
                "(s) => Math.max(...[...document.querySelectorAll(s)]"
                ".filter((e) => e.getClientRects().length)"
                ".map((e) => e.getBoundingClientRect().right))",
                selector,
            )
            assert right <= width, f"{selector} ends at {right} px at {width}"
        changed = page.locator("#generation-3 > td").nth(4)
        box = changed.bounding_box()
        assert box is not None and box["width"] >= min(240, width - 60), box
