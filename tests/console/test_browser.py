"""The console in a real browser: Chromium through Playwright against
pytest-django's live server. Data is made in-process through the services
(no worker), so a quarantined case exists without waiting for a sweep.

Set ``CONSOLE_SCREENSHOT_DIR`` to keep screenshots of the pages visited.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from console.owners import create_owner
from recovery.models import CaseState, Decision, Inspection, RecoveryCase
from tests.conftest import purge_broker
from tickets.admission import admit_ticket

from .helpers import echo_endpoint, finished_gated_ticket, quarantined_case

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "pw-olive-1"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    # Playwright's sync API keeps an event loop in this thread; the ORM calls
    # that set up each test run beside it, not inside it.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


# Report every Content-Security-Policy violation to the console, where the
# page fixture collects it (Chromium also logs its own "Refused to ..." line).
CSP_REPORTER = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error("CSP violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});
"""


def is_csp_violation(text: str) -> bool:
    return "Content Security Policy" in text or text.startswith("CSP violation")


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    # Actions and navigations wait for the page: a loaded machine takes
    # more than 10 s to answer one now and then.
    context.set_default_timeout(30_000)
    context.add_init_script(CSP_REPORTER)
    # The console and the API docs work offline: nothing may be fetched from
    # anywhere but the app itself.
    outside: list[str] = []

    def refuse(route):
        outside.append(route.request.url)
        route.abort()

    # Only what is not the app's is routed: the browser matches the pattern,
    # so the app's own requests do not each wait for this process to answer
    # (its main thread is often busy with the test, not with the browser).
    context.route(re.compile(rf"^(?!{re.escape(live_server.url)}/)"), refuse)
    page = context.new_page()
    violations: list[str] = []
    page.on("console", lambda msg: is_csp_violation(msg.text) and violations.append(msg.text))
    yield page
    context.close()
    release_live_watches()
    purge_broker()  # admissions published dispatches that no worker will take
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(violations)
    assert not outside, f"requests outside the app: {outside}"


def release_live_watches() -> None:
    """A closed page's live-region watches still wait in the live server's
    threads (a server does not see a client leave), and keep the listener's
    session open: stopping the listener answers them without a read, so the
    test database can be dropped (console/views/live.py)."""
    from tickets import waits  # noqa: PLC0415

    waits.stop_listener()


def shot(page, name: str) -> None:
    folder = os.environ.get("CONSOLE_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def log_in(page, live_server, path: str, username: str, password: str) -> None:
    page.goto(f"{live_server.url}{path}")
    expect(page).to_have_url(re.compile(r"/login/\?next="))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{live_server.url}{path}")
    # The console's scripts are deferred: they have run (keyboard shortcuts,
    # live refresh) once the document has fired DOMContentLoaded.
    page.wait_for_load_state("domcontentloaded")


def mark_document(page) -> None:
    """A flag that survives htmx swaps but not a full page load."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page) -> None:
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def test_operator_filters_tickets_opens_one_and_follows_its_trace(page, live_server):
    case = quarantined_case("web.stuck")
    echo_endpoint("web.echo")
    root = admit_ticket(endpoint="web.echo", input={"brief": "weekly"}).ticket
    child = admit_ticket(endpoint="web.echo", input={"part": 1}, parent_id=root.id).ticket
    # An owner of both endpoints sees all of these tickets.
    create_owner(username="olive", password=PASSWORD, endpoints=["web.stuck", "web.echo"])

    log_in(page, live_server, "/tickets/", "olive", PASSWORD)
    table = page.locator("#tickets")
    expect(table.locator(f'code[title="{case.ticket_id}"]')).to_be_visible()
    expect(table.locator(f'code[title="{child.id}"]')).to_be_visible()

    mark_document(page)
    page.get_by_label("State").select_option("queued")
    # The table region is swapped by htmx and the URL keeps the filter.
    expect(page).to_have_url(re.compile(r"state=queued"))
    expect(table.locator(f'code[title="{case.ticket_id}"]')).to_have_count(0)
    expect(table.locator(f'code[title="{child.id}"]')).to_be_visible()
    expect(table.locator(".badge", has_text="recovering")).to_have_count(0)
    assert_not_reloaded(page)
    shot(page, "tickets-filtered")

    table.locator(f'a:has(code[title="{child.id}"])').click()
    expect(page).to_have_url(f"{live_server.url}/tickets/{child.id}/")
    expect(page.locator("h1")).to_contain_text(str(child.id))
    expect(page.locator("#ticket")).to_contain_text("admitted")  # the timeline
    shot(page, "ticket")

    page.get_by_role("link", name=re.compile(r"^Trace")).click()
    expect(page).to_have_url(f"{live_server.url}/traces/{root.trace_id}/")
    rows = page.locator("#tree tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator(f'code[title="{root.id}"]')).to_be_visible()
    expect(rows.nth(1).locator(f'code[title="{child.id}"]')).to_be_visible()
    expect(rows.nth(1).locator(".branch")).to_be_visible()  # nested under the root
    shot(page, "trace")


def test_owner_inspects_and_decides_without_a_page_reload(page, live_server):
    case = quarantined_case("web.stuck")
    create_owner(username="olive", password=PASSWORD, endpoints=["web.stuck"])

    log_in(page, live_server, "/", "olive", PASSWORD)
    quarantined = page.locator("section", has_text="Quarantined endpoints")
    expect(quarantined).to_contain_text("web.stuck")
    shot(page, "dashboard")
    quarantined.locator(f'a[href="/recovery/{case.id}/"]').click()
    expect(page).to_have_url(f"{live_server.url}/recovery/{case.id}/")
    expect(page.get_by_text("Take an inspection first")).to_be_visible()

    mark_document(page)
    page.get_by_role("button", name="Take inspection").click()
    expect(page.locator("#messages")).to_contain_text("Inspection taken")
    inspection = Inspection.objects.get(case_id=case.id)
    expect(page.locator("#inspections")).to_contain_text(inspection.sha256)
    # The snapshot is there, folded away until asked for.
    snapshot = page.locator("#inspections details pre")
    expect(snapshot).to_be_hidden()
    page.locator("#inspections summary").first.click()
    expect(snapshot).to_contain_text('"turn"')
    assert_not_reloaded(page)
    shot(page, "case-inspected")

    form = page.locator("form", has=page.get_by_role("button", name="Record decision"))
    expect(form.get_by_label("Inspection")).to_have_value(str(inspection.id))
    form.get_by_label("Action").select_option("release")
    form.get_by_label("Rationale").fill("the worker host was rebooted at 11:02")
    form.get_by_role("button", name="Record decision").click()
    # Release needs evidence: the service says so inside the form's region.
    expect(page.locator("#casework [role=alert]")).to_contain_text("evidence")
    assert not Decision.objects.filter(case_id=case.id).exists()

    form = page.locator("form", has=page.get_by_role("button", name="Record decision"))
    form.get_by_label("Action").select_option("finalize_orphan")
    form.get_by_label("Rationale").fill("no stop evidence; finalize with no invented answer")
    form.get_by_role("button", name="Record decision").click()
    expect(page.locator("#messages")).to_contain_text("Decision recorded")
    expect(page.locator("#decisions")).to_contain_text("no stop evidence; finalize")
    expect(page.locator("#casework dl.kv").first).to_contain_text("decided")
    assert_not_reloaded(page)
    assert RecoveryCase.objects.get(id=case.id).state == CaseState.DECIDED
    shot(page, "case-decided")

    page.get_by_label("What failed").fill("the runner ignored its interrupt")
    page.get_by_label("Evidence that made the diagnosis possible").fill(
        "no heartbeat after the interrupt, no stop receipt"
    )
    page.get_by_label("What would prevent it").fill("runners poll interrupted()")
    page.get_by_role("button", name="Write lesson").click()
    expect(page.locator("#lesson")).to_contain_text("the runner ignored its interrupt")
    expect(page.get_by_role("button", name="Write lesson")).to_have_count(0)
    assert_not_reloaded(page)
    assert RecoveryCase.objects.get(id=case.id).state == CaseState.CLOSED
    shot(page, "case-closed")


def test_owner_approves_a_gated_result_in_place(page, live_server):
    ticket = finished_gated_ticket("web.gated")
    create_owner(username="gus", password=PASSWORD, endpoints=["web.gated"])

    log_in(page, live_server, f"/tickets/{ticket.id}/", "gus", PASSWORD)
    delivery = page.locator("#delivery")
    expect(delivery).to_contain_text("awaiting approval")
    mark_document(page)
    questions: list[str] = []
    page.on("dialog", lambda d: (questions.append(d.message), d.accept()))
    page.get_by_role("button", name="Approve result").click()
    expect(page.locator("#messages")).to_contain_text("Result approved")
    expect(delivery).not_to_contain_text("awaiting approval")
    expect(delivery).to_contain_text("by gus")
    expect(page.get_by_role("button", name="Approve result")).to_have_count(0)
    assert questions and questions[0].startswith("Approve the result of ticket"), questions
    assert_not_reloaded(page)


def test_api_docs_render_offline_under_the_csp(page, live_server):
    """Swagger UI's JS and CSS come from the app's own static files: the page
    renders with every outside request refused and no CSP violation."""
    page.goto(f"{live_server.url}/api/v1/docs")
    # Generous: the first openapi.json of a process builds the whole schema.
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Claimcheck", timeout=30_000)
    expect(page.locator(".opblock-summary-path", has_text="/api/v1/tickets").first).to_be_visible()
    shot(page, "api-docs")
