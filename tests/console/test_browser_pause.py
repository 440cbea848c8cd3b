"""Pause and drain in a real browser, with a real worker: an owner pauses an
endpoint (a reason and a confirmation), a ticket waits while it is paused
(the dashboard lists the endpoint), the owner resumes it and the ticket
completes; staff stop a worker consuming the turns queue on the workers
page, a ticket waits, and resuming the consuming runs it. axe-core on the
new panels in light and dark mode; screenshots to ``var/screenshots/``."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.models import EndpointEvent
from runtime.models import Worker, WorkerEvent
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

from .helpers import echo_endpoint
from .test_browser import PASSWORD, browser, log_in, page  # noqa: F401
from .test_browser_ops import AXE, AXE_RUN, SCREENSHOTS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(autouse=True)
def fast_refresh(settings):
    settings.CONSOLE_REFRESH_S = 1


def _accept_dialogs(page) -> list[str]:
    questions: list[str] = []
    page.on("dialog", lambda d: (questions.append(d.message), d.accept()))
    return questions


def _axe(page, live_server, paths: list[str]) -> list[str]:
    """axe-core's serious and critical findings. The page's CSP forbids the
    inline styles axe sets, so it runs in a context that bypasses it (the
    CSP itself is checked by the ``page`` fixture)."""
    context = page.context.browser.new_context(
        viewport={"width": 1440, "height": 1000}, bypass_csp=True
    )
    context.add_cookies(page.context.cookies())
    checker = context.new_page()
    axe = AXE.read_text()
    problems: list[str] = []
    try:
        for scheme in ("light", "dark"):
            checker.emulate_media(color_scheme=scheme)
            for path in paths:
                checker.goto(f"{live_server.url}{path}")
                checker.wait_for_load_state("load")
                checker.add_script_tag(content=axe)
                problems += [f"{scheme} {path}: {v}" for v in checker.evaluate(AXE_RUN)]
    finally:
        context.close()
    return problems


def test_an_owner_pauses_a_ticket_waits_and_the_resume_runs_it(
    page, live_server, worker, django_user_model
):
    echo_endpoint("web.pause")
    echo_endpoint("web.other")
    olive = create_owner(username="olive", password=PASSWORD, endpoints=["web.pause"])

    log_in(page, live_server, "/endpoints/web.pause/", "olive", PASSWORD)
    questions = _accept_dialogs(page)
    panel = page.locator("#pause")
    expect(panel).to_contain_text("New tickets queue until the resume")
    panel.get_by_label("Reason for the pause").fill("rotating the model's API key")
    panel.get_by_role("button", name="Pause").click()
    expect(page.locator("#messages")).to_contain_text("Paused: nothing new starts")
    assert questions and "No new turn starts" in questions[0], questions
    expect(page.locator("#pause [data-drain]")).to_have_attribute("data-drain", "idle")
    expect(page.locator("[data-paused]").first).to_contain_text("rotating the model's API key")
    event = EndpointEvent.objects.get(endpoint__address="web.pause", kind="paused")
    assert event.actor == "user:olive" and event.detail["reason"] == "rotating the model's API key"

    # A ticket admitted now waits; one on another endpoint, admitted after
    # it, runs (the worker and its dispatcher were free to start the first).
    waiting = admit_ticket(endpoint="web.pause", input={"q": "wait"}, submitter=olive).ticket
    other = admit_ticket(endpoint="web.other", input={"q": "go"}).ticket
    wait_for(
        lambda: Ticket.objects.get(id=other.id).state == "succeeded",
        timeout=30,
        message="the other endpoint's ticket",
    )
    page.goto(f"{live_server.url}/tickets/{waiting.id}/")
    expect(page.locator("#ticket dl.kv").first).to_contain_text("queued")
    assert Ticket.objects.get(id=waiting.id).state == "queued"

    page.goto(f"{live_server.url}/")
    row = page.locator('#paused tbody[data-paused="web.pause"]')
    expect(row).to_contain_text("paused")
    expect(row).to_contain_text("rotating the model's API key")
    expect(row.locator("td.num")).to_have_text("1")
    problems = _axe(page, live_server, ["/", "/endpoints/web.pause/"])
    assert not problems, "\n".join(problems)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "dashboard-paused.png"), full_page=True)

    page.goto(f"{live_server.url}/endpoints/web.pause/")
    expect(panel).to_contain_text("1 ticket waits for the resume")
    page.screenshot(path=str(SCREENSHOTS / "endpoint-paused.png"), full_page=True)
    panel.get_by_label("Reason for the resume").fill("key rotated")
    panel.get_by_role("button", name="Resume").click()
    expect(page.locator("#messages")).to_contain_text("Resumed")
    assert "Resume web.pause?" in questions[-1], questions
    history = page.locator("#pause-history li")
    expect(history).to_have_count(2)
    expect(history.first).to_contain_text("resumed by user:olive: key rotated")

    page.goto(f"{live_server.url}/tickets/{waiting.id}/")
    expect(page.locator("#ticket dl.kv").first).to_contain_text("succeeded", timeout=30_000)
    page.goto(f"{live_server.url}/")
    expect(page.locator("#paused")).to_contain_text("None: no owner has paused an endpoint.")


def test_staff_stop_a_worker_consuming_and_resume_it(page, live_server, worker, django_user_model):
    echo_endpoint("web.drain")
    django_user_model.objects.create_user("sam", is_staff=True)
    create_owner(username="sam", password=PASSWORD, endpoints=["web.drain"])
    node = wait_for(
        lambda: Worker.objects.filter(name__startswith="turns@").first(),
        timeout=30,
        message="the worker to register",
    ).name

    log_in(page, live_server, "/workers/", "sam", PASSWORD)
    questions = _accept_dialogs(page)
    card = page.locator(f'article[data-worker="{node}"]')
    expect(card.locator("[data-consuming]")).to_have_attribute("data-consuming", "turns")
    card.get_by_label("Reason").fill("kernel update on this host")
    card.get_by_role("button", name="Stop consuming").click()
    expect(page.locator("#messages")).to_contain_text("takes no new turn; the turns it runs finish")
    assert questions and "consuming turns" in questions[0], questions
    expect(card.locator("[data-consuming]")).to_have_attribute("data-consuming", "none")
    expect(card.locator("[data-consumer-event]")).to_contain_text("kernel update on this host")
    problems = _axe(page, live_server, ["/workers/"])
    assert not problems, "\n".join(problems)
    page.screenshot(path=str(SCREENSHOTS / "workers-not-consuming.png"), full_page=True)

    # The worker reports it itself on its next heartbeat; a ticket then waits.
    seen = Worker.objects.get(name=node).last_seen_at
    wait_for(
        lambda: Worker.objects.filter(name=node, consuming=["control"], last_seen_at__gt=seen),
        timeout=10,
        message="the worker's own report",
    )
    ticket = admit_ticket(endpoint="web.drain", input={"q": 1}).ticket
    for _ in range(2):  # two heartbeats later, still queued
        seen = Worker.objects.get(name=node).last_seen_at
        wait_for(
            lambda seen=seen: Worker.objects.filter(name=node, last_seen_at__gt=seen).exists(),
            timeout=10,
            message="a heartbeat",
        )
    assert Ticket.objects.get(id=ticket.id).state == "queued"

    card.get_by_label("Reason").fill("update done")
    card.get_by_role("button", name="Resume consuming").click()
    expect(page.locator("#messages")).to_contain_text("consumes turns again")
    wait_for(
        lambda: Ticket.objects.get(id=ticket.id).state == "succeeded",
        timeout=30,
        message="the ticket to run once the worker consumes again",
    )
    assert list(WorkerEvent.objects.filter(worker=node).values_list("kind", flat=True)) == [
        "consumer_cancelled",
        "consumer_added",
    ]
