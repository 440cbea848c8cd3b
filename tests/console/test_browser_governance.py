"""Governed change in a real browser: from a quarantine through inspection,
decision, a lesson that proposes a smaller turn budget, another owner's
approval from the dashboard's review queue, to the endpoint page showing
both generations' outcomes side by side (and the lesson's case page the
same for its approved proposal)."""

# ruff: noqa: F811 - the fixtures imported from the other browser tests are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.models import ChangeProposal, Endpoint
from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import Turn

from .helpers import quarantined_case
from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_lesson_proposes_a_budget_another_owner_approves_and_both_generations_show(
    page, live_server
):
    case = quarantined_case("web.stuck")
    create_owner(username="olive", password=PASSWORD, endpoints=["web.stuck"])
    create_owner(username="oscar", password=PASSWORD, endpoints=["web.stuck"])

    # Olive: inspection, decision, a lesson proposing a smaller budget.
    log_in(page, live_server, f"/recovery/{case.id}/", "olive", PASSWORD)
    page.get_by_role("button", name="Take inspection").click()
    expect(page.locator("#messages")).to_contain_text("Inspection taken")
    form = page.locator("form", has=page.get_by_role("button", name="Record decision"))
    form.get_by_label("Action").select_option("finalize_orphan")
    form.get_by_label("Rationale").fill("no stop evidence; finalize with no invented answer")
    form.get_by_role("button", name="Record decision").click()
    expect(page.locator("#messages")).to_contain_text("Decision recorded")
    page.get_by_label("What failed").fill("the turn hung past its budget")
    page.get_by_label("Evidence that made the diagnosis possible").fill("no stop receipt")
    page.get_by_label("What would prevent it").fill("a budget that fits the work")
    page.get_by_label("Propose a turn budget (seconds)").fill("45")
    page.get_by_role("button", name="Write lesson").click()
    lesson = page.locator("#lesson")
    expect(lesson).to_contain_text("the turn hung past its budget")
    expect(lesson).to_contain_text("Proposed change")
    expect(lesson.locator(".badge", has_text="open")).to_be_visible()
    proposal = ChangeProposal.objects.get()
    assert proposal.changes == {"turn_budget_s": 45.0}
    assert proposal.origin == {"lesson": str(case.lesson.id), "case": str(case.id)}
    shot(page, "governance-lesson")

    # Olive proposed it: she may not approve it.
    page.goto(f"{live_server.url}/proposals/{proposal.id}/")
    expect(page.get_by_role("button", name="Approve and apply")).to_have_count(0)
    expect(page.locator("#review")).to_contain_text("another owner")

    # Oscar: the dashboard's review queue, the proposal, approve.
    page.context.clear_cookies()
    log_in(page, live_server, "/", "oscar", PASSWORD)
    queue = page.locator("#review-queue")
    expect(queue).to_contain_text("web.stuck")
    queue.locator(f'a[href="/proposals/{proposal.id}/"]').click()
    expect(page.locator("#proposal-status")).to_contain_text("open")
    expect(page.locator("table.diff")).to_contain_text("turn_budget_s")
    expect(page.get_by_text("the lesson of case")).to_be_visible()
    page.get_by_label("Reason").fill("45 s fits the work; the lesson shows why")
    page.get_by_role("button", name="Approve and apply").click()
    expect(page.locator("#messages")).to_contain_text("generation 2 is live")
    expect(page.locator("#proposal-status")).to_contain_text("approved")
    shot(page, "governance-approved")
    endpoint = Endpoint.objects.get(address="web.stuck")
    assert (endpoint.generation, endpoint.turn_budget_s) == (2, 45.0)

    # A turn under the new generation.
    ticket = admit_ticket(endpoint="web.stuck", input={"task": "after"}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    assert Turn.objects.get(ticket_id=ticket.id).generation == 2

    page.goto(f"{live_server.url}/endpoints/web.stuck/")
    expect(page.locator("#current-generation")).to_have_text("2")
    table = page.locator("#generations table.outcomes")
    now, before = table.locator('tr[data-generation="2"]'), table.locator('tr[data-generation="1"]')
    # generation, turns, succeeded, failed, timed out, quarantined
    expect(now.locator("td").nth(1)).to_have_text("1")
    expect(now.locator("td").nth(2)).to_have_text("1")
    expect(before.locator("td").nth(1)).to_have_text("1")
    expect(before.locator("td").nth(5)).to_have_text("1")
    expect(page.locator("#generation-2")).to_contain_text("turn_budget_s")
    shot(page, "governance-endpoint")

    # The lesson's case page shows the same for its approved proposal.
    page.goto(f"{live_server.url}/recovery/{case.id}/")
    helped = page.locator(f"#lesson-proposal-{proposal.id}")
    expect(helped).to_contain_text("generation #2")
    expect(helped.locator('tr[data-generation="2"] td').nth(2)).to_have_text("1")
