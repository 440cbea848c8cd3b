"""Small console defects a first hour met, in a real browser at a desktop
(1280 px) and a phone (390 px): a form's hidden fields get no label, a
diff prints a whole budget as the number it is ("20 -> 12", not "12.0"), and
a trace's timeline rows on a phone are labelled "Timeline", not with the
axis's ticks run together."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.proposals import propose_change
from recovery import services as recovery
from tickets.admission import admit_ticket

from .helpers import echo_endpoint, quarantined_case
from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _fits(page, width: int) -> None:
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width


def test_hidden_fields_have_no_label_on_the_lesson_and_change_forms(page, live_server):
    case = quarantined_case("web.stuck")
    olive = create_owner(username="olive", password=PASSWORD, endpoints=["web.stuck"])
    inspection = recovery.inspect_case(case_id=case.id, user=olive)
    recovery.decide(
        case_id=case.id,
        user=olive,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="no stop evidence",
    )
    log_in(page, live_server, f"/recovery/{case.id}/", "olive", PASSWORD)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for path, form_field in (
            (f"/recovery/{case.id}/", "lesson-proposal_generation"),
            ("/endpoints/web.stuck/", "change-generation"),
        ):
            page.goto(f"{live_server.url}{path}")
            hidden = page.locator(f'input[type="hidden"][name="{form_field}"]')
            expect(hidden).to_have_count(1)  # the form still sends it
            expect(page.locator("label", has_text="eneration")).to_have_count(0)
            expect(page.locator(f'label[for="{hidden.get_attribute("id")}"]')).to_have_count(0)
            if path.startswith("/recovery/"):  # the endpoint page's width is another matter
                _fits(page, width)
        shot(page, f"labels-{width}")


def test_a_diff_prints_a_whole_budget_as_an_integer(page, live_server):
    echo_endpoint("web.budget", turn_budget_s=20)  # as seed_demo makes them: an int
    olive = create_owner(username="olive", password=PASSWORD, endpoints=["web.budget"])
    proposal = propose_change(
        address="web.budget",
        user=olive,
        base_generation=1,
        changes={"turn_budget_s": 12.0},  # as the console's form sends it: a float
        reason="shorter",
    )
    log_in(page, live_server, f"/proposals/{proposal.id}/", "olive", PASSWORD)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        row = page.locator("table.diff tbody tr", has_text="turn_budget_s")
        expect(row.locator("td").nth(1)).to_have_text("20")
        expect(row.locator("td").nth(2)).to_have_text("12")
        _fits(page, width)
        shot(page, f"diff-{width}")


def test_timeline_rows_on_a_phone_are_labelled_timeline_not_with_the_ticks(page, live_server):
    echo_endpoint("web.echo")
    root = admit_ticket(endpoint="web.echo", input={"brief": "weekly"}).ticket
    admit_ticket(endpoint="web.echo", input={"part": 1}, parent_id=root.id)
    create_owner(username="olive", password=PASSWORD, endpoints=["web.echo"])
    log_in(page, live_server, f"/traces/{root.trace_id}/", "olive", PASSWORD)
    lanes = page.locator("#waterfall tbody td.wf-lane")
    expect(lanes).to_have_count(2)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for i in range(2):
            expect(lanes.nth(i)).to_have_attribute("data-label", "Timeline")
        # The axis's ticks stay in the header, where a desktop shows them.
        if width == 1280:
            expect(page.locator("#waterfall thead .wf-axis")).to_be_visible()
        label = lanes.first.evaluate("(td) => getComputedStyle(td, '::before').content")
        assert "Spans on the time axis" not in label and "+" not in label, label
        _fits(page, width)
        shot(page, f"timeline-{width}")
