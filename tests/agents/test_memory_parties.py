"""An agent endpoint's memory is per submitter unless its owner declares it
shared (``memory: "shared"``, runtime/agents/memory.py): what one submitter
told the agent is never recalled for another, including through an exchange
that waited on children; the endpoint page says which."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


@pytest.fixture
def people(django_user_model):
    return (
        django_user_model.objects.create_user("xavier", password="pw-x-123456"),
        django_user_model.objects.create_user("yvonne", password="pw-y-123456"),
    )


def ask(address: str, prompt: str, who) -> Ticket:
    ticket = admit_ticket(endpoint=address, input={"prompt": prompt}, submitter=who).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    assert ticket.state in ("succeeded", "waiting"), ticket.error
    return ticket


def finish_delegation(parent: Ticket) -> None:
    for child in Ticket.objects.filter(parent=parent, callback_for__isnull=True):
        runtime.run_ticket(ticket_id=child.id)
    for callback in Ticket.objects.filter(callback_for__parent=parent):
        runtime.run_ticket(ticket_id=callback.id)
    parent.refresh_from_db()
    assert parent.state == "succeeded", parent.error


def test_one_submitters_remember_is_not_recalled_by_another(make_endpoint, people):
    x, y = people
    make_endpoint("demo.echo")
    make_endpoint("mem.private", runner=AGENT)
    ask("mem.private", "remember the vault code is 7311", x)
    # An exchange of X's that waited on children (its callback turns have no
    # submitter of their own) is X's too.
    finish_delegation(ask("mem.private", "delegate alpha", x))
    ask("mem.private", "remember tea", y)
    assert ask("mem.private", "recall", y).result == "I remember: tea"
    assert ask("mem.private", "recall", x).result == "I remember: the vault code is 7311"


def test_a_shared_memory_is_every_submitters(make_endpoint, people):
    x, y = people
    make_endpoint("mem.shared", runner={**AGENT, "memory": "shared"})
    ask("mem.shared", "remember the vault code is 7311", x)
    assert ask("mem.shared", "recall", y).result == "I remember: the vault code is 7311"


def test_a_memory_mode_outside_the_two_is_400(api):
    resp = api.post("/endpoints", {"address": "m", "runner": {**AGENT, "memory": "global"}})
    assert resp.status_code == 400 and "memory" in resp.json()["detail"], resp.content


def test_the_endpoint_page_says_whose_memory_it_is(make_endpoint, people, client):
    x, _ = people
    make_endpoint("mem.private", runner=AGENT)
    make_endpoint("mem.shared", runner={**AGENT, "memory": "shared"})
    client.force_login(x)  # a submitter, not an owner: the runner's settings are hidden
    private = client.get("/endpoints/mem.private/").content.decode()
    shared = client.get("/endpoints/mem.shared/").content.decode()
    assert "per submitter" in private and "shared by every submitter" not in private
    assert "shared by every submitter" in shared
