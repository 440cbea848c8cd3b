"""The per-period chart in a real browser, on the dashboard and on an
endpoint's page: its legend is visible, choosing a range redraws the time
axis (minutes for 1 h, weekday and hour for 24 h and 7 d), and hovering a
bar highlights its slot, whose title carries the bar's figures."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from runtime import turns as runtime
from tickets.admission import admit_ticket

from .helpers import echo_endpoint
from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MINUTE_TICK = re.compile(r"^\d\d:\d\dZ$")
DAY_TICK = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d:\d\dZ$")


def tick_labels(chart) -> list[str]:
    """The time axis's labels, left to right, without the closing "now"."""
    return [t for t in chart.locator("svg text.tick").all_text_contents() if t.endswith("Z")]


def check_chart(page, base_url: str, path: str) -> None:
    chart = page.locator("#throughput")
    expect(chart.locator(".legend")).to_be_visible()
    expect(chart.locator(".legend")).to_contain_text("admitted")
    expect(chart.locator(".legend")).to_contain_text("finished")
    expect(chart.locator(".legend .swatch-in")).to_be_visible()
    expect(chart.locator('svg[data-range="1h"]')).to_be_visible()
    hour_ticks = tick_labels(chart)
    assert len(hour_ticks) >= 4 and all(MINUTE_TICK.match(t) for t in hour_ticks), hour_ticks

    # A bar's slot: hovering it highlights the slot; its title has the figures.
    slot = chart.locator("svg g.slot").filter(
        has=page.locator("title", has_text=re.compile(r"admitted [1-9]"))
    )
    expect(slot).not_to_have_count(0)
    hit = slot.first.locator("rect.hit")
    before = hit.evaluate("(el) => getComputedStyle(el).fill")
    hit.hover()
    expect(hit).not_to_have_css("fill", before)
    figures = slot.first.locator("title").text_content()
    assert re.fullmatch(r"\d\d:\d\dZ–\d\d:\d\dZ: admitted [1-3], finished [0-3]", figures), figures
    # The same figures are in the table.
    chart.locator("summary").click()
    expect(chart.locator("tbody tr")).to_have_count(60)

    for span, heading, bars in (("24h", "Last 24 hours", 24), ("7d", "Last 7 days", 28)):
        chart.get_by_role("link", name=span).click()
        expect(page).to_have_url(f"{base_url}{path}?range={span}")
        chart = page.locator("#throughput")
        expect(chart.locator(f'svg[data-range="{span}"]')).to_be_visible()
        expect(chart.locator("h2")).to_contain_text(heading)
        expect(chart.get_by_role("link", name=span)).to_have_attribute("aria-current", "true")
        expect(chart.locator("svg g.slot")).to_have_count(bars)
        ticks = tick_labels(chart)
        assert ticks != hour_ticks and all(DAY_TICK.match(t) for t in ticks), ticks
        # The three tickets in one bar (this hour's, or this 6 hours').
        bar = chart.locator("svg g.slot title", has_text=re.compile(r"admitted 3, finished 3$"))
        expect(bar).to_have_count(1)
        expect(chart.locator(".legend")).to_be_visible()


def test_the_chart_legend_range_and_hover_on_the_dashboard_and_an_endpoint(page, live_server):
    echo_endpoint("chart.echo")
    create_owner(username="olive", password=PASSWORD, endpoints=["chart.echo"])
    for n in range(3):
        runtime.run_ticket(ticket_id=admit_ticket(endpoint="chart.echo", input={"n": n}).ticket.id)

    log_in(page, live_server, "/", "olive", PASSWORD)
    check_chart(page, live_server.url, "/")
    shot(page, "dashboard-chart-7d")

    page.goto(f"{live_server.url}/endpoints/chart.echo/")
    check_chart(page, live_server.url, "/endpoints/chart.echo/")
    # The turns by outcome follow the range too.
    expect(page.locator("#hour h2")).to_contain_text("Turns in the last 7 days")
    shot(page, "endpoint-chart-7d")
