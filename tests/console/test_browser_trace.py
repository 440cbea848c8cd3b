"""The trace page's timeline in a real browser: a research root whose two
children's callbacks resume it, one child quarantined and re-run by an
owner's decision, the rest run by a real worker. The waterfall draws each
ticket's spans on one axis with the re-run and callbacks marked and the
callback that completed the root highlighted; axe-core finds nothing
serious on it, light or dark."""

# ruff: noqa: F811 - the fixtures imported from the other browser tests are parameters here
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_for
from tickets.models import Ticket, TicketState

from .helpers import waiting_family
from .test_browser import browser, log_in, page, shot  # noqa: F401
from .test_browser_ops import AXE, AXE_RUN, SCREENSHOTS, axe_page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_waterfall_shows_a_rerun_and_highlights_the_completing_callback(
    page, axe_page, live_server, celery_procs
):
    root, first, second, rerun = waiting_family("wb", "olive")
    # A real worker runs the re-run and the second child, then both
    # callbacks on the root's endpoint; the last one completes the root.
    celery_procs.worker_and_beat()
    wait_for(
        lambda: Ticket.objects.get(id=root.id).state == TicketState.SUCCEEDED,
        timeout=60,
        message="the worker to run the children and the callbacks that complete the root",
    )
    root.refresh_from_db()
    completer = Ticket.objects.get(turn_id=root.completed_by_turn_id)
    other = Ticket.objects.filter(callback_for__isnull=False).exclude(id=completer.id).get()

    log_in(page, live_server, f"/tickets/{root.id}/", "olive", "pw-olive-1")
    page.get_by_role("link", name=re.compile(r"^Trace")).click()
    expect(page).to_have_url(f"{live_server.url}/traces/{root.trace_id}/")
    waterfall = page.locator("#waterfall")
    expect(waterfall.locator("h2")).to_contain_text("6 tickets")
    expect(waterfall.locator(".legend")).to_contain_text("waiting for children")
    rows = waterfall.locator("tbody tr")
    expect(rows).to_have_count(6)

    # The root queued, ran and waited; each span's figures on hover and in cells.
    root_row = waterfall.locator(f'tr[data-ticket="{root.id}"]')
    expect(root_row.locator("rect.wf-waiting")).to_have_count(1)
    root_row.locator("rect.wf-waiting").hover()
    expect(root_row.locator("rect.wf-waiting title")).to_contain_text(
        re.compile(r"^waited [\d.]+ (ms|s) from \d\d:\d\d:\d\dZ, \+")
    )
    expect(root_row.locator("td.num").nth(2)).to_have_text(re.compile(r"[\d.]+ (ms|s)"))
    assert "waited" in root_row.locator("svg").get_attribute("aria-label")

    # The quarantined child has no known end; its re-run is marked as one.
    expect(waterfall.locator(f'tr[data-ticket="{first.id}"] rect.wf-unknown')).to_have_count(1)
    rerun_row = waterfall.locator(f'tr[data-ticket="{rerun.id}"]')
    expect(rerun_row).to_have_class(re.compile(r"\bwf-re-run\b"))
    expect(rerun_row).to_contain_text("re-run of")

    # Only the callback whose turn completed the root is highlighted.
    highlighted = waterfall.locator("tr.wf-completing")
    expect(highlighted).to_have_count(1)
    expect(highlighted).to_have_attribute("data-ticket", str(completer.id))
    expect(highlighted).to_contain_text("completed the root")
    expect(highlighted.locator(".wf-mark")).to_be_visible()
    other_row = waterfall.locator(f'tr[data-ticket="{other.id}"]')
    expect(other_row).to_have_class(re.compile(r"\bwf-callback\b"))
    expect(other_row).not_to_contain_text("completed the root")
    # The lineage table below still lists the six.
    expect(page.locator("#tree tbody tr")).to_have_count(6)
    shot(page, "trace-waterfall")
    # On a phone the rows stack and each lane takes the panel's width; the
    # page never scrolls sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    lane = root_row.locator("svg.wf-spans")
    width = lane.evaluate("(el) => el.getBoundingClientRect().width")
    assert 250 <= width <= 390, width
    expect(root_row.locator("rect.wf-waiting")).to_be_visible()
    shot(page, "trace-waterfall-390")
    page.set_viewport_size({"width": 1440, "height": 1000})

    # axe-core on the trace page, light and dark (its CSP is bypassed: axe
    # sets inline styles; `page` above checked the CSP).
    log_in(axe_page, live_server, "/", "olive", "pw-olive-1")
    axe_page.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    problems = []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        axe_page.emulate_media(color_scheme=scheme)
        axe_page.goto(f"{live_server.url}/traces/{root.trace_id}/")
        axe_page.wait_for_load_state("load")
        axe_page.add_script_tag(content=AXE.read_text())
        problems += [f"{scheme}: {v}" for v in axe_page.evaluate(AXE_RUN)]
        axe_page.screenshot(path=str(SCREENSHOTS / f"trace-waterfall-{scheme}.png"), full_page=True)
    assert not problems, "\n".join(problems)
