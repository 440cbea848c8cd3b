"""The console on a phone, and the colour theme, in a real browser.

At 390 x 844 (a phone, touch, the page's own viewport) every page fits: the
page never scrolls sideways (``document.documentElement.scrollWidth <=
390``), the top bar's links and "Log out" are on the screen, the ticket
list's "select all" box is there, and axe-core finds nothing serious with
the light and the dark theme. The same pages at 1280 px keep one top bar
line. Screenshots (phone-*.png, desktop-*.png) go to ``var/screenshots/``
(gitignored) or ``CONSOLE_SCREENSHOT_DIR``.

The theme: chosen in the top bar, applied at once, remembered for the user
by the server (a reload, another browser), with or without script.
"""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from console import preferences
from console.owners import create_owner
from recovery import services as recovery
from runtime import registry
from runtime import turns as runtime
from tickets.admission import admit_ticket

from .helpers import echo_endpoint, finished_gated_ticket, quarantined_case
from .test_browser import (  # noqa: F401
    CSP_REPORTER,
    PASSWORD,
    browser,
    is_csp_violation,
    log_in,
    page,
    release_live_watches,
)
from .test_browser_ops import AXE, AXE_RUN

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(os.environ.get("CONSOLE_SCREENSHOT_DIR") or "var/screenshots")
PHONE = {"width": 390, "height": 844}
DARK_BG, LIGHT_BG = "rgb(18, 22, 29)", "rgb(245, 246, 248)"


def console_world(django_user_model) -> dict[str, str]:
    """Every kind of page with something on it; olive (staff, owner of all)
    sees them all. Returns page name -> path."""
    case = quarantined_case("web.stuck")
    echo_endpoint("web.echo")
    root = admit_ticket(endpoint="web.echo", input={"brief": "weekly"}).ticket
    admit_ticket(endpoint="web.echo", input={"part": 1}, parent_id=root.id)
    done = admit_ticket(endpoint="web.echo", input={"q": "a long-ish input " * 20}).ticket
    runtime.run_ticket(ticket_id=done.id)
    finished_gated_ticket("web.gated")
    django_user_model.objects.create_user("olive", is_staff=True)
    olive = create_owner(
        username="olive", password=PASSWORD, endpoints=["web.stuck", "web.echo", "web.gated"]
    )
    recovery.inspect_case(case_id=case.id, user=olive)
    # A worker whose slot still runs the quarantined turn (the workers page).
    registry.register_worker(
        name="turns@hostA", host="hostA", pid=4242, queues=["turns"], pool_size=2
    )
    registry.set_node("turns@hostA")
    try:
        registry.slot_busy(case.turn_id)
    finally:
        registry.set_node("")
    return {
        "dashboard": "/",
        "tickets": "/tickets/",
        "ticket": f"/tickets/{case.ticket_id}/",
        "ticket-done": f"/tickets/{done.id}/",
        "trace": f"/traces/{root.trace_id}/",
        "case": f"/recovery/{case.id}/",
        "cases": "/recovery/",
        "endpoints": "/endpoints/",
        "endpoint": "/endpoints/web.echo/",
        "workers": "/workers/",
        "lessons": "/lessons/",
        "obligations": "/obligations/",
    }


@pytest.fixture
def phone(browser, live_server):
    """A phone's page; Content-Security-Policy violations fail the test."""
    context = browser.new_context(
        viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2
    )
    context.set_default_timeout(30_000)
    context.add_init_script(CSP_REPORTER)
    page = context.new_page()
    violations: list[str] = []
    page.on("console", lambda msg: is_csp_violation(msg.text) and violations.append(msg.text))
    yield page
    context.close()
    release_live_watches()
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(violations)


@pytest.fixture
def phone_axe(browser, live_server):
    """A phone's page whose CSP is bypassed: axe-core sets inline styles."""
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True, bypass_csp=True)
    context.set_default_timeout(30_000)
    yield context.new_page()
    context.close()
    release_live_watches()


def off_screen(page, width: int) -> list[str]:
    """Top bar controls that do not lie wholly inside the screen."""
    return page.evaluate(
        """(width) => Array.from(document.querySelectorAll(
            ".topbar a, .topbar button:not(#help-toggle)"))
          .filter((el) => { const r = el.getBoundingClientRect();
                            return r.width === 0 || r.left < 0 || r.right > width; })
          .map((el) => el.textContent.trim())""",
        width,
    )


def test_every_page_fits_a_phone(phone, live_server, django_user_model):
    pages = console_world(django_user_model)
    log_in(phone, live_server, "/", "olive", PASSWORD)
    phone.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wide, cut, tall = {}, {}, {}
    # The narrowest and widest common phones too; screenshots at 390.
    for screen in (360, 414, PHONE["width"]):
        phone.set_viewport_size({"width": screen, "height": PHONE["height"]})
        for name, path in pages.items():
            phone.goto(f"{live_server.url}{path}")
            phone.wait_for_load_state("load")
            width, height = phone.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            if width > screen:
                wide[f"{name}@{screen}"] = width
            if controls := off_screen(phone, screen):
                cut[f"{name}@{screen}"] = controls
            if screen == PHONE["width"]:
                tall[name] = height
                phone.screenshot(path=str(SCREENSHOTS / f"phone-{name}.png"), full_page=True)
    assert not wide, f"pages wider than the phone: {wide}"
    assert not cut, f"top bar controls off the screen: {cut}"
    # The ticket page's timeline and JSON scroll in boxes of their own.
    assert tall["ticket"] < 3000, tall

    # Stacked rows: every cell says its column; "select all" still works.
    phone.goto(f"{live_server.url}/tickets/")
    first = phone.locator("#tickets tbody tr").first
    expect(first.locator('td[data-label="State"]')).to_be_visible()
    expect(first.locator('td[data-label="Endpoint"]')).to_be_visible()
    phone.locator("#select-all").check()
    boxes = phone.locator('#tickets input[name="ticket"]')
    assert boxes.count() == 5
    for i in range(boxes.count()):
        expect(boxes.nth(i)).to_be_checked()
    # The filters take the width of the screen, not their own.
    search = phone.locator("#search").bounding_box()
    assert search is not None and search["width"] > PHONE["width"] - 40, search


def test_axe_on_a_phone_in_both_themes(phone_axe, live_server, django_user_model):
    page = phone_axe
    pages = console_world(django_user_model)
    log_in(page, live_server, "/", "olive", PASSWORD)
    page.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    axe = AXE.read_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems = []
    for theme, background in (("light", LIGHT_BG), ("dark", DARK_BG)):
        page.get_by_role("button", name=theme.title(), exact=True).click()
        expect(page.locator("html")).to_have_attribute("data-theme", theme)
        for name, path in pages.items():
            page.goto(f"{live_server.url}{path}")
            page.wait_for_load_state("load")
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
            page.add_script_tag(content=axe)
            problems += [f"{theme} {name}: {v}" for v in page.evaluate(AXE_RUN)]
            if theme == "dark":
                page.screenshot(path=str(SCREENSHOTS / f"phone-dark-{name}.png"), full_page=True)
    assert not problems, "\n".join(problems)


def test_desktop_keeps_one_top_bar_line(page, live_server, django_user_model):
    pages = console_world(django_user_model)
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in(page, live_server, "/", "olive", PASSWORD)
    page.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("load")
        page.screenshot(path=str(SCREENSHOTS / f"desktop-{name}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280, name
        assert page.locator(".topbar").bounding_box()["height"] <= 40, name
        # Tables stay tables: their header row shows (a chart's figures
        # table waits, collapsed, in its <details>: the first shown one).
        if page.locator("table.grid thead").count():
            expect(page.locator("table.grid thead th >> visible=true").first).to_be_visible()


def test_the_theme_switches_at_once_and_is_remembered(page, live_server, django_user_model):
    user = django_user_model.objects.create_user("olive", password=PASSWORD)
    log_in(page, live_server, "/tickets/", "olive", PASSWORD)
    html, body = page.locator("html"), "getComputedStyle(document.body).backgroundColor"
    page.emulate_media(color_scheme="light")
    expect(html).to_have_attribute("data-theme", "system")
    expect(page.get_by_role("button", name="System", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    assert page.evaluate(body) == LIGHT_BG

    page.evaluate("window.__noReload = true")
    with page.expect_response(re.compile(r"/preferences/theme/$")) as answer:
        page.get_by_role("button", name="Dark", exact=True).click()
    assert answer.value.status == 200
    expect(html).to_have_attribute("data-theme", "dark")
    assert page.evaluate(body) == DARK_BG  # the OS says light: the choice wins
    expect(page.get_by_role("button", name="Dark", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    assert page.evaluate("window.__noReload === true"), "switching reloaded the page"
    assert preferences.theme_of(user) == "dark"

    # The server renders it: a reload paints dark from the first frame.
    page.reload()
    expect(html).to_have_attribute("data-theme", "dark")
    expect(page.locator('meta[name="color-scheme"]')).to_have_attribute("content", "dark")
    assert page.evaluate(body) == DARK_BG

    # "System" follows the operating system again.
    with page.expect_response(re.compile(r"/preferences/theme/$")):
        page.get_by_role("button", name="System", exact=True).click()
    expect(html).to_have_attribute("data-theme", "system")
    assert page.evaluate(body) == LIGHT_BG
    page.emulate_media(color_scheme="dark")
    assert page.evaluate(body) == DARK_BG
    assert preferences.theme_of(user) == "system"


def test_the_theme_without_script(browser, live_server, django_user_model):
    user = django_user_model.objects.create_user("olive", password=PASSWORD)
    context = browser.new_context(java_script_enabled=False, color_scheme="dark")
    page = context.new_page()
    try:
        log_in(page, live_server, "/tickets/?state=queued", "olive", PASSWORD)
        page.get_by_role("button", name="Light", exact=True).click()
        expect(page).to_have_url(f"{live_server.url}/tickets/?state=queued")
        expect(page.locator("html")).to_have_attribute("data-theme", "light")
        expect(page.get_by_role("button", name="Light", exact=True)).to_have_attribute(
            "aria-pressed", "true"
        )
        assert preferences.theme_of(user) == "light"
    finally:
        context.close()
        release_live_watches()
