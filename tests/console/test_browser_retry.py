"""Retry and re-run with changes in a real browser: a single retry with a
changed input and budget, a bulk retry of everything shown (select-all)
that lists each refusal with its reason, and a re-run from the case page
with a smaller budget after the warning that the same input and budget
repeat the turn that overran. axe-core on both pages, light and dark."""

# ruff: noqa: F811 - the fixtures imported from the other browser tests are parameters here
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.services import create_endpoint
from recovery import services as recovery
from runtime import services as runtime_services
from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import Ticket

from .helpers import echo_endpoint, quarantined_case
from .test_browser import PASSWORD, browser, log_in, page, release_live_watches  # noqa: F401
from .test_browser_ops import AXE, AXE_RUN, axe_page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_retry_one_with_a_new_input_then_all_shown_with_refusals_listed(page, live_server):
    echo_endpoint("web.echo", turn_budget_s=30)
    create_endpoint(address="web.fail", runner={"kind": "python", "path": "runtime.demo.fail"})
    create_owner(username="olive", password=PASSWORD, endpoints=["web.echo", "web.fail"])
    cancelled = admit_ticket(endpoint="web.echo", input={"q": "old"}).ticket
    runtime_services.cancel_ticket(ticket_id=cancelled.id, actor="test", reason="withdrawn")
    failed = admit_ticket(endpoint="web.fail", input={"q": 2}).ticket
    runtime.run_ticket(ticket_id=failed.id)
    done = admit_ticket(endpoint="web.echo", input={"q": 3}).ticket
    runtime.run_ticket(ticket_id=done.id)

    log_in(page, live_server, f"/tickets/{cancelled.id}/", "olive", PASSWORD)
    page.get_by_text("Retry as a new ticket").click()
    page.get_by_label("Input (JSON object; edit to change it)").fill('{"q": "new"}')
    page.get_by_label(re.compile(r"Turn budget, seconds")).fill("5")
    page.locator("#retry-reason").fill("the requester fixed the query")
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.locator("#messages")).to_contain_text("Retried as ticket")
    retry = Ticket.objects.get(retry_of_id=cancelled.id)
    expect(page).to_have_url(f"{live_server.url}/tickets/{retry.id}/")
    expect(page.locator("#messages")).to_contain_text(f"Retried as ticket {retry.id}")
    expect(page.locator("#ticket dl.kv").first).to_contain_text("Retry of")
    expect(page.locator("#ticket dl.kv").first).to_contain_text("budget 5 s")
    assert (retry.input, retry.budget_s) == ({"q": "new"}, 5)
    page.goto(f"{live_server.url}/tickets/{cancelled.id}/")
    expect(page.locator("#ticket dl.kv").first).to_contain_text("Retried as")

    # Every ticket shown: the retry (queued), the succeeded one, the failed
    # one and the cancelled one (retried already). One is retried.
    page.goto(f"{live_server.url}/tickets/")
    page.locator("#select-all").check()
    expect(page.locator('input[name="ticket"]:checked')).to_have_count(4)
    page.get_by_label("With the selected").select_option("retry")
    page.get_by_label("Reason").fill("the upstream outage is over")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    page.get_by_role("button", name="Apply to selected").click()
    messages = page.locator("#messages")
    expect(messages).to_contain_text("1 ticket retried as new tickets")
    assert dialogs and dialogs[0].startswith("Retry 4 ticket(s)"), dialogs
    expect(messages).to_contain_text(f"{done.id} is succeeded")
    expect(messages).to_contain_text(f"{retry.id} is queued")
    expect(messages).to_contain_text(f"already retried as {retry.id}")
    expect(messages.locator(".flash-error")).to_have_count(3)
    again = Ticket.objects.get(retry_of_id=failed.id)
    assert again.input == {"q": 2} and again.budget_s is None

    # The dashboard's chart: a legend, a range to choose, the figures in a table.
    page.goto(f"{live_server.url}/")
    throughput = page.locator("#throughput")
    expect(throughput.locator(".legend")).to_contain_text("admitted")
    expect(throughput.locator(".legend")).to_contain_text("finished")
    throughput.get_by_role("link", name="24h").click()
    expect(page).to_have_url(f"{live_server.url}/?range=24h")
    expect(page.locator('#throughput svg[data-range="24h"]')).to_be_visible()
    expect(page.locator("#throughput h2")).to_contain_text("Last 24 hours")
    page.locator("#throughput summary").click()
    expect(page.locator("#throughput tbody tr")).to_have_count(24)
    expect(page.locator("#throughput svg .hit title").last).to_contain_text(
        re.compile(r"admitted [1-5], finished")
    )


def test_rerun_with_a_smaller_budget_after_the_warning(axe_page, live_server):
    page = axe_page
    case = quarantined_case("web.stuck")  # its turn overran: interrupted at its deadline
    fresh = quarantined_case("web.stuck2")  # for axe-core, its form untouched
    owner = create_owner(username="olive", password=PASSWORD, endpoints=["web.stuck", "web.stuck2"])
    for c in (case, fresh):
        recovery.inspect_case(case_id=c.id, user=owner)

    log_in(page, live_server, f"/recovery/{case.id}/", "olive", PASSWORD)
    page.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    warning = page.locator("#rerun-warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text(f"repeats turn #{case.turn.seq}")
    expect(warning).to_contain_text("Last outcome of this input on web.stuck")
    expect(warning).to_contain_text("recovering")

    form = page.locator("#decision-form")
    form.get_by_label("Action").select_option("authorize_rerun")
    budget = form.get_by_label("Re-run turn budget, seconds")
    budget.fill("2")
    expect(warning).to_be_hidden()
    budget.fill("")
    expect(warning).to_be_visible()  # the same input and budget again
    budget.fill("2")
    form.get_by_label("Rationale").fill("the task hangs at the full budget; try a short one")
    form.get_by_role("button", name="Record decision").click()
    expect(page.locator("#messages")).to_contain_text("Decision recorded: authorize_rerun")
    rerun = Ticket.objects.get(rerun_of_id=case.ticket_id)
    assert rerun.budget_s == 2 and rerun.input == case.ticket.input
    expect(page.locator("#decisions")).to_contain_text(str(rerun.id)[-8:])

    # axe-core on the case page with its warning and the ticket page with
    # its retry form (the orphaned original), light and dark.
    axe = AXE.read_text()
    problems = []
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for path in (f"/recovery/{fresh.id}/", f"/tickets/{case.ticket_id}/"):
            page.goto(f"{live_server.url}{path}")
            page.wait_for_load_state("load")
            if "tickets" in path:
                page.get_by_text("Retry as a new ticket").click()
            page.add_script_tag(content=axe)
            problems += [f"{scheme} {path}: {v}" for v in page.evaluate(AXE_RUN)]
    assert not problems, "\n".join(problems)
    release_live_watches()
