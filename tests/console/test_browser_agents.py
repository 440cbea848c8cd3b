"""An agent's tool calls waiting for approval, decided in a real browser on
the endpoint page: the owner sees the pending call (tool, arguments, the
turn that asked), approves one with a reason and denies another; each
decision resumes the agent in a new turn, the approved call runs and its
ticket completes, the denied one's agent is told why. A resumed agent that
asks again shows its next round's call. axe-core on the page, light and
dark."""

# ruff: noqa: F811 - the fixtures imported from the other browser tests are parameters here
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from endpoints.services import create_endpoint
from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import WAIT_EVENT_KINDS, Ticket, TicketEvent

from .helpers import echo_endpoint
from .test_browser import PASSWORD, browser, log_in, release_live_watches  # noqa: F401
from .test_browser_ops import AXE, AXE_RUN, axe_page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


def waiting(endpoint: str, prompt: str) -> Ticket:
    ticket = admit_ticket(endpoint=endpoint, input={"prompt": prompt}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    assert ticket.state == "waiting", ticket.error
    return ticket


def pending_call(ticket: Ticket) -> str:
    """The call of the round the ticket waits on now."""
    last = ticket.events.filter(kind__in=WAIT_EVENT_KINDS).order_by("-id").first()
    pending = last.detail["continuation"]["agent"]["pending"]
    [call_id] = [call_id for call_id, call in pending.items() if call["kind"] == "approval"]
    return call_id


def resume(ticket: Ticket, call_id: str) -> Ticket:
    """Run the approval ticket the decision admitted (the agent's new turn)."""
    approval = Ticket.objects.get(parent=ticket, dedupe_key__endswith=call_id)
    runtime.run_ticket(ticket_id=approval.id)
    ticket.refresh_from_db()
    return ticket


def test_an_owner_approves_one_call_and_denies_another(axe_page, live_server):
    page = axe_page
    echo_endpoint("demo.echo")
    create_endpoint(address="demo.agent", runner=AGENT)
    create_endpoint(
        address="rounds.agent",
        runner={**AGENT, "path": "tests.agents.rounds_agent.build"},
    )
    create_owner(username="olive", password=PASSWORD, endpoints=["demo.agent", "rounds.agent"])
    to_ops = waiting("demo.agent", "send ops")
    to_all = waiting("demo.agent", "send everyone")
    ops_call, all_call = pending_call(to_ops), pending_call(to_all)

    log_in(page, live_server, "/endpoints/demo.agent/", "olive", PASSWORD)
    page.evaluate("() => localStorage.setItem('claimcheck.liveRefresh', 'paused')")
    approvals = page.locator("#approvals")
    rows = approvals.locator("tbody tr")
    expect(rows).to_have_count(2)
    ops_row = rows.filter(has_text=ops_call)
    expect(ops_row).to_contain_text("send_report")
    expect(ops_row).to_contain_text('{"to": "ops"}')
    expect(ops_row).to_contain_text(str(to_ops.turn_id)[-8:])  # the turn that asked
    expect(ops_row.get_by_role("link")).to_have_attribute("href", f"/tickets/{to_ops.id}/")
    expect(page.locator("#conversation")).to_contain_text("send_report")

    # The page before any decision: no serious accessibility problem.
    axe = AXE.read_text()
    problems = []
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.reload()
        page.wait_for_load_state("load")
        page.add_script_tag(content=axe)
        problems += [f"{scheme}: {v}" for v in page.evaluate(AXE_RUN)]
    assert not problems, "\n".join(problems)
    page.emulate_media(color_scheme="light")

    # A reason is required: the browser keeps the form until it has one.
    ops_row = approvals.locator("tbody tr").filter(has_text=ops_call)
    ops_row.get_by_role("button", name="Approve").click()
    assert ops_row.get_by_label("Reason").evaluate("el => el.validity.valueMissing")
    assert not TicketEvent.objects.filter(ticket=to_ops, kind="tool_call_decided").exists()
    ops_row.get_by_label("Reason").fill("ops asked for it")
    ops_row.get_by_role("button", name="Approve").click()
    expect(page.locator("#messages")).to_contain_text(
        f"Call {ops_call} approved; the agent resumes in a new turn."
    )
    ops_row = approvals.locator("tbody tr").filter(has_text=ops_call)
    expect(ops_row).to_contain_text("approved by user:olive: ops asked for it")
    expect(ops_row.locator("form")).to_have_count(0)

    all_row = approvals.locator("tbody tr").filter(has_text=all_call)
    all_row.get_by_label("Reason").fill("too wide")
    all_row.get_by_role("button", name="Deny").click()
    expect(page.locator("#messages")).to_contain_text(f"Call {all_call} denied")
    expect(approvals.locator("tbody tr").filter(has_text=all_call)).to_contain_text(
        "denied by user:olive: too wide"
    )

    # Each decision resumes the agent in a new turn; the tickets complete.
    to_ops = resume(to_ops, ops_call)
    assert to_ops.state == "succeeded", to_ops.error
    to_all = resume(to_all, all_call)
    assert to_all.state == "succeeded", to_all.error
    page.goto(f"{live_server.url}/endpoints/demo.agent/")
    expect(page.locator("#approvals")).to_contain_text("No call is waiting for approval.")
    page.goto(f"{live_server.url}/tickets/{to_ops.id}/")
    expect(page.locator("#ticket")).to_contain_text("succeeded")
    expect(page.locator("#ticket")).to_contain_text("sent to ops with key cc-")
    expect(page.locator("#ticket")).to_contain_text("tool_call_decided")
    page.goto(f"{live_server.url}/tickets/{to_all.id}/")
    expect(page.locator("#ticket")).to_contain_text("an owner denied this call: too wide")
    assert "sent to" not in to_all.result

    # A resumed agent that asks again: the page shows the next round's call
    # on the same ticket, and its decision completes it.
    rounds = waiting("rounds.agent", "steps delegate alpha | send ops")
    [child] = Ticket.objects.filter(parent=rounds)
    runtime.run_ticket(ticket_id=child.id)
    runtime.run_ticket(ticket_id=Ticket.objects.get(callback_for=child).id)
    rounds.refresh_from_db()
    assert rounds.state == "waiting", rounds.error
    call = pending_call(rounds)
    page.goto(f"{live_server.url}/endpoints/rounds.agent/")
    row = page.locator("#approvals tbody tr").filter(has_text=call)
    expect(row).to_contain_text("send_report")
    expect(row.get_by_role("link")).to_have_attribute("href", f"/tickets/{rounds.id}/")
    row.get_by_label("Reason").fill("second round, fine")
    row.get_by_role("button", name="Approve").click()
    expect(page.locator("#messages")).to_contain_text(f"Call {call} approved")
    rounds = resume(rounds, call)
    assert rounds.state == "succeeded", rounds.error
    assert "alpha" in rounds.result and "sent to ops" in rounds.result
    release_live_watches()
