"""Console actions of issue 13 through Django's test client: search, the
delivery and time filters, bulk approve / cancel with a required reason,
under the API's rules (a stranger's ticket is not found, approving needs an
owner)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.test_authorization import World
from tickets.models import DeliveryState, Ticket, TicketEvent, TicketState

pytestmark = pytest.mark.django_db


def rows(response) -> str:
    return response.content.decode()


def test_search_by_id_head_tail_dedupe_key_and_trace(client):
    world = World()
    root = world.ticket()
    other = world.admit("m.ep", dedupe_key="invoice-42")
    client.force_login(world.users["owner"])
    text = str(root.id)
    for q in (text, text[:13], text[-8:], "…" + text[-8:], text[-12:].upper(), text[-17:]):
        body = rows(client.get("/tickets/", {"q": q}))
        assert f'title="{root.id}"' in body, q
        assert f'title="{other.id}"' not in body, q
    body = rows(client.get("/tickets/", {"q": "invoice-42"}))
    assert f'title="{other.id}"' in body and f'title="{root.id}"' not in body
    body = rows(client.get("/tickets/", {"q": root.trace_id}))
    assert f'title="{root.id}"' in body
    assert "No tickets match." in rows(client.get("/tickets/", {"q": "deadbeef"}))


def test_a_search_by_tail_reads_the_id_tail_index():
    """The tail's query narrows on the expression ticket_id_tail_idx holds
    (the id's reversed last group); were the two
    to drift apart, every tail search would read the whole ledger."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from tickets.selectors import find_tickets

    world = World()
    root = world.ticket()
    for tail in (str(root.id)[-8:], str(root.id)[-17:]):
        with CaptureQueriesContext(connection) as queries:
            found, _ = find_tickets(user=world.users["owner"], q=tail)
        assert [t.id for t in found] == [root.id]
        (sql,) = [q["sql"] for q in queries.captured_queries if "reverse(" in q["sql"]]
        # The selector's own predicate on the tail, alone: with the caller's
        # scope beside it the planner may rightly start from the scope's
        # indexes on a small ledger, so the whole query's plan proves
        # nothing about the expression; alone, only the tail index serves it.
        (tail,) = re.findall(r"reverse\(right\([^)]*\)\) LIKE '[^']*'", sql)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute(f"EXPLAIN SELECT 1 FROM tickets_ticket WHERE {tail}")
            plan = "\n".join(row[0] for row in cur.fetchall())
        assert "ticket_id_tail_idx" in plan, plan


def test_a_stranger_finds_nothing_by_search(client):
    world = World()
    root = world.ticket()
    client.force_login(world.users["stranger"])
    for q in (str(root.id), str(root.id)[-8:], root.trace_id):
        assert f'title="{root.id}"' not in rows(client.get("/tickets/", {"q": q}))


def test_delivery_and_time_filters(client):
    world = World()
    gated, queued = world.gated(), world.ticket()
    client.force_login(world.users["owner"])
    body = rows(client.get("/tickets/", {"delivery": "awaiting_approval"}))
    assert f'title="{gated.id}"' in body and f'title="{queued.id}"' not in body
    later = (timezone.now() + timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M")
    assert "No tickets match." in rows(client.get("/tickets/", {"since": later}))
    assert f'title="{gated.id}"' in rows(client.get("/tickets/", {"until": later}))
    bad = client.get("/tickets/", {"since": "yesterday"})
    assert bad.status_code == 400 and "not a date and time" in rows(bad)
    assert client.get("/tickets/", {"delivery": "lost"}).status_code == 400


def bulk(client, action, tickets, reason="batch reviewed"):
    return client.post(
        "/tickets/bulk/",
        {"action": action, "reason": reason, "ticket": [str(t.id) for t in tickets]},
        follow=True,
    )


@pytest.mark.parametrize(
    ("actor", "approved", "says"),
    [
        ("stranger", False, "not found"),
        ("submitter", False, "only an owner"),
        ("owner", True, "1 ticket approved"),
        ("staff", True, "1 ticket approved"),
    ],
)
def test_bulk_approve_follows_the_api_rules(client, actor, approved, says):
    world = World()
    gated = world.gated()
    client.force_login(world.users[actor])
    body = rows(bulk(client, "approve", [gated]))
    assert says in body
    gated.refresh_from_db()
    assert (gated.delivery_state == DeliveryState.PENDING) == approved
    events = TicketEvent.objects.filter(ticket_id=gated.id, kind="approved")
    assert [e.detail.get("reason") for e in events] == (["batch reviewed"] if approved else [])


@pytest.mark.parametrize(
    ("actor", "cancelled"),
    [("stranger", False), ("submitter", True), ("owner", True), ("staff", True)],
)
def test_bulk_cancel_follows_the_api_rules(client, actor, cancelled):
    world = World()
    queued, finished = world.ticket(), world.gated()
    client.force_login(world.users[actor])
    body = rows(bulk(client, "cancel", [queued, finished]))
    queued.refresh_from_db()
    assert (queued.state == TicketState.CANCELLED) == cancelled
    assert Ticket.objects.get(id=finished.id).state == TicketState.SUCCEEDED
    # The finished one is refused by the service, one by one.
    assert "Refused" in body
    if cancelled:
        event = TicketEvent.objects.get(ticket_id=queued.id, kind="cancelled")
        assert event.detail["reason"] == "batch reviewed"  # beside the delivery it opened


def test_bulk_needs_a_reason_and_a_selection(client):
    world = World()
    queued = world.ticket()
    client.force_login(world.users["owner"])
    assert "A reason is required" in rows(bulk(client, "cancel", [queued], reason="  "))
    assert "Select at least one ticket" in rows(bulk(client, "cancel", []))
    assert "Choose approve, cancel or retry" in rows(bulk(client, "delete", [queued]))
    queued.refresh_from_db()
    assert queued.state == TicketState.QUEUED
    assert client.get("/tickets/bulk/").status_code == 405


def test_cancel_needs_a_reason(client):
    world = World()
    queued = world.ticket()
    client.force_login(world.users["submitter"])
    refused = client.post(f"/tickets/{queued.id}/cancel/", {"reason": ""}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 422 and "reason is required" in rows(refused)
    queued.refresh_from_db()
    assert queued.state == TicketState.QUEUED


def test_dashboard_lists_what_awaits_approval(client):
    world = World()
    gated = world.gated()
    client.force_login(world.users["owner"])
    body = rows(client.get("/"))
    assert 'id="approvals"' in body and f'title="{gated.id}"' in body
    client.force_login(world.users["stranger"])
    assert f'title="{gated.id}"' not in rows(client.get("/"))


def test_a_result_waiting_to_be_pulled_is_not_an_overdue_debt(client, settings):
    """A finished pull-delivery ticket keeps its obligation open until the
    requester acknowledges, but the console says the requester has only to
    pull it, and keeps "overdue" for what is really owed."""
    from tickets import obligations  # noqa: PLC0415

    settings.OBLIGATION_UPDATE_INTERVAL_S = 0.001
    world = World()
    queued = world.ticket()  # still owed: the work has not run
    pulled = world.delivered_by_pull()
    pulled.refresh_from_db()
    assert pulled.delivery_state == DeliveryState.PENDING and pulled.obligation_state == "open"
    obligations.sweep_overdue()
    client.force_login(world.users["staff"])

    dashboard = rows(client.get("/"))
    overdue = dashboard[dashboard.index("Overdue obligations") : dashboard.index("Recent tickets")]
    assert f'title="{queued.id}"' in overdue
    assert f'title="{pulled.id}"' not in overdue

    page = rows(client.get("/obligations/"))
    assert "nothing owed: the result is ready to pull" in page
    assert "the result: the work is queued" in page
    assert page.count('class="overdue"') == 1

    ticket_page = rows(client.get(f"/tickets/{pulled.id}/"))
    assert "ready to pull" in ticket_page and 'tone-warn">overdue' not in ticket_page


def test_lineage_labels_times_and_links_to_the_open_case(client):
    world = World()
    root, child = world.ticket(), world.child()
    case_id = world.case()
    client.force_login(world.users["staff"])
    body = rows(client.get(f"/traces/{root.trace_id}/"))
    assert "<td>root</td>" in body and "<td>child</td>" in body
    assert f'title="{child.id}"' in body
    assert "data-live-watch" in body  # queued tickets: the tree refreshes itself
    assert "so far" in body  # the queued ones' wait, counting
    from recovery.models import RecoveryCase  # noqa: PLC0415

    case = RecoveryCase.objects.get(id=case_id)
    ticket_page = rows(client.get(f"/tickets/{case.ticket_id}/"))
    assert f'href="/recovery/{case.id}/"' in ticket_page
    trace = rows(client.get(f"/traces/{Ticket.objects.get(id=case.ticket_id).trace_id}/"))
    assert f'href="/recovery/{case.id}/"' in trace
