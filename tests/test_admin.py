"""The Django admin is view-only for every ledger record (tickets/admin.py,
endpoints/admin.py, recovery/admin.py on core/readonly_admin.py): pages
render with real data, every write is refused, and the big tables' change
lists never count a whole table."""

from __future__ import annotations

import re
import socket

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.http import urlencode

from core.readonly_admin import CappedPaginator
from recovery import services as recovery
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import wait_for
from tickets import delivery
from tickets.admission import admit_ticket
from tickets.models import Delivery, Ticket

pytestmark = pytest.mark.django_db

MODELS = [
    "tickets.Ticket",
    "tickets.TicketEvent",
    "tickets.Trace",
    "tickets.Callback",
    "tickets.Delivery",
    "tickets.DeliveryAttempt",
    "endpoints.Endpoint",
    "endpoints.EndpointAlias",
    "tickets.EndpointLock",
    "tickets.Turn",
    "tickets.ContextEntry",
    "endpoints.EndpointGeneration",
    "endpoints.ChangeProposal",
    "endpoints.ChangeReview",
    "endpoints.RouteGeneration",
    "recovery.RecoveryCase",
    "recovery.CaseEvidence",
    "recovery.Inspection",
    "recovery.Decision",
    "recovery.Lesson",
]


def closed_port_url() -> str:
    with socket.socket() as s:  # nobody listens here: the attempt fails and is logged
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


@pytest.fixture
def records(make_endpoint, settings, django_user_model):
    """At least one row of every model, made through the services."""
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    owner = django_user_model.objects.create_user("owner")
    make_endpoint("adm-echo", aliases=["adm-old"], owners=["owner"])
    root = admit_ticket(
        endpoint="adm-echo",
        input={"n": 1},
        dedupe_key="root-key",
        requester={"webhook_url": closed_port_url()},
    ).ticket
    runtime.run_ticket(ticket_id=root.id)  # turn, context entry, events, delivery
    delivery.send(delivery_id=Delivery.objects.get(ticket_id=root.id).id)  # one failed attempt
    child = admit_ticket(
        endpoint="adm-echo", input={"c": 1}, parent_id=root.id, return_to="adm-echo"
    ).ticket
    runtime.run_ticket(ticket_id=child.id)  # its callback ticket

    make_endpoint("adm-stuck", path="runtime.demo.stuck", owners=["owner"], interrupt_grace_s=0.05)
    stuck = admit_ticket(endpoint="adm-stuck", input={"seconds": 60}).ticket
    started = runtime.start_turn(ticket_id=stuck.id)
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id), message="quarantine"
    )
    late = runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({"late": 1}),
        source="api",
    )
    assert not late.accepted  # kept as case evidence only
    inspection = recovery.inspect_case(case_id=case_id, user=owner)
    recovery.decide(
        case_id=case_id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="the agent never answered",
    )
    recovery.write_lesson(
        case_id=case_id,
        user=owner,
        what_failed="a stuck runner",
        evidence="no stop receipt",
        prevention="a shorter budget",
        proposal={"generation": 1, "changes": {"turn_budget_s": 30}},
    )
    from endpoints.models import ChangeProposal
    from endpoints.proposals import review_proposal

    staff = django_user_model.objects.create_user("reviewer", is_staff=True)
    review_proposal(
        proposal_id=ChangeProposal.objects.get().id, user=staff, approve=True, reason="ok"
    )
    for label in MODELS:
        assert apps.get_model(label).objects.exists(), label
    return {"root": Ticket.objects.get(id=root.id), "child": child}


def urls(label: str, pk=None) -> dict[str, str]:
    app, model = label.lower().split(".")
    out = {
        "changelist": reverse(f"admin:{app}_{model}_changelist"),
        "add": reverse(f"admin:{app}_{model}_add"),
    }
    if pk is not None:
        out["change"] = reverse(f"admin:{app}_{model}_change", args=[pk])
        out["delete"] = reverse(f"admin:{app}_{model}_delete", args=[pk])
    return out


def test_every_changelist_and_change_page_renders(admin_client, records):
    # One loop over the models (the records are built once): the label in
    # each assertion names the model that failed.
    for label in MODELS:
        obj = apps.get_model(label).objects.order_by("pk").first()
        u = urls(label, obj.pk)
        listing = admin_client.get(u["changelist"])
        assert listing.status_code == 200, (label, listing.content[:500])
        assert b'name="q"' in listing.content, label  # every record is searchable
        searched = admin_client.get(u["changelist"], {"q": str(obj.pk)})
        assert searched.status_code == 200, label
        page = admin_client.get(u["change"])
        assert page.status_code == 200, label
        # View only: no form to save and no delete link.
        assert b'name="_save"' not in page.content, label
        assert u["delete"].encode() not in page.content, label


def test_every_write_is_refused_and_changes_nothing(admin_client, records):
    for label in MODELS:
        model = apps.get_model(label)
        obj = model.objects.order_by("pk").first()
        before = model.objects.filter(pk=obj.pk).values().get()
        count = model.objects.count()
        u = urls(label, obj.pk)
        assert admin_client.post(u["change"], {"_save": "Save"}).status_code == 403, label
        assert admin_client.post(u["delete"], {"post": "yes"}).status_code == 403, label
        assert admin_client.get(u["add"]).status_code == 403, label
        assert admin_client.post(u["add"], {}).status_code == 403, label
        assert model.objects.filter(pk=obj.pk).values().get() == before, label
        assert model.objects.count() == count, label


WHOLE_COUNT = re.compile(r'SELECT COUNT\(\*\)[^()]* FROM "tickets_ticket"', re.IGNORECASE)


def test_the_ticket_changelist_never_counts_the_whole_table(admin_client, records):
    url = urls("tickets.Ticket")["changelist"]
    for query in ("", "?state=succeeded", "?" + urlencode({"q": "adm-echo"})):
        with CaptureQueriesContext(connection) as ctx:
            resp = admin_client.get(url + query)
        assert resp.status_code == 200
        sql = [q["sql"] for q in ctx.captured_queries]
        counts = [s for s in sql if "COUNT(" in s.upper() and "tickets_ticket" in s]
        assert counts, "the capped count should be there"
        assert not [s for s in counts if WHOLE_COUNT.search(s)], counts
        assert all("LIMIT" in s.upper() for s in counts), counts
        # The list does not load the big JSON columns, and joins what it shows.
        listing = [s for s in sql if s.startswith('SELECT "tickets_ticket"."id"')]
        assert listing and all('"tickets_ticket"."input"' not in s for s in listing)
        assert len(sql) < 15, sql


def test_past_the_cap_the_page_says_more_than(admin_client, records, monkeypatch):
    monkeypatch.setattr(CappedPaginator, "cap", 2)
    resp = admin_client.get(urls("tickets.Ticket")["changelist"])
    assert Ticket.objects.count() > 2
    assert b"more than 2 tickets" in resp.content


def test_searches_are_exact_and_use_no_casts_or_likes(admin_client, records):
    root, child = records["root"], records["child"]
    url = urls("tickets.Ticket")["changelist"]
    for term in (str(root.id), root.trace_id, "adm-echo:root-key"):
        with CaptureQueriesContext(connection) as ctx:
            resp = admin_client.get(url, {"q": term})
        assert str(root.id).encode() in resp.content, term
        if term != root.trace_id:
            assert str(child.id).encode() not in resp.content, term
        searched = " ".join(q["sql"] for q in ctx.captured_queries if "tickets_ticket" in q["sql"])
        assert "UPPER(" not in searched and " LIKE " not in searched and "::text" not in searched
    by_alias = admin_client.get(url, {"q": "adm-old"})  # an alias names its endpoint
    assert str(root.id).encode() in by_alias.content and str(child.id).encode() in by_alias.content
    nothing = admin_client.get(url, {"q": "no-such-thing"})
    assert str(root.id).encode() not in nothing.content


def test_staff_need_the_view_permission_and_never_get_more(client, records, django_user_model):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_ticket"))
    client.force_login(viewer)
    root = records["root"]
    u = urls("tickets.Ticket", root.pk)
    assert client.get(u["changelist"]).status_code == 200
    assert client.get(u["change"]).status_code == 200
    assert client.post(u["change"], {"_save": "Save"}).status_code == 403
    assert client.get(urls("tickets.Turn")["changelist"]).status_code == 403

    stranger = django_user_model.objects.create_user("stranger", password="pw", is_staff=True)
    client.force_login(stranger)
    assert client.get(u["changelist"]).status_code == 403


def test_labels_are_plural_in_english(admin_client, records):
    index = admin_client.get(reverse("admin:index")).content.decode()
    for label in ("Deliveries", "Endpoint aliases", "Context entries", "Case evidence"):
        assert f">{label}<" in index, label
    for wrong in ("Deliverys", "aliass", "entrys", "evidences"):
        assert wrong not in index, wrong


UTC_Z = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\b")


def test_times_read_as_the_console_prints_them(admin_client, records):
    root = records["root"]
    listing = admin_client.get(urls("tickets.Ticket")["changelist"]).content.decode()
    assert root.created_at.strftime("%Y-%m-%d %H:%M:%SZ") in listing
    assert not re.search(r"\b(a\.m\.|p\.m\.)", listing)
    page = admin_client.get(urls("tickets.Ticket", root.pk)["change"]).content.decode()
    assert root.finished_at.strftime("%Y-%m-%d %H:%M:%SZ") in page
    assert UTC_Z.search(admin_client.get(urls("tickets.Turn")["changelist"]).content.decode())


@pytest.fixture
def strangers_ticket(make_endpoint, django_user_model):
    django_user_model.objects.create_user("someone-else")
    make_endpoint("adm-other", owners=["someone-else"])
    return admit_ticket(endpoint="adm-other", input={"theirs": 1}).ticket


def test_an_owner_logs_in_and_sees_only_what_they_own(
    client, records, strangers_ticket, django_user_model
):
    owner = django_user_model.objects.get(username="owner")
    owner.set_password("pw-owner-1")
    owner.save()
    assert not owner.is_staff
    login = client.post(
        reverse("admin:login"), {"username": "owner", "password": "pw-owner-1", "next": "/admin/"}
    )
    assert login.status_code == 302 and login["Location"] == "/admin/"
    index = client.get(reverse("admin:index")).content.decode()
    for label in ("Tickets", "Deliveries", "Recovery cases", "Turns", "Endpoints"):
        assert f">{label}<" in index, label
    assert ">Users<" not in index and ">Groups<" not in index  # staff-only, as before

    root = records["root"]
    listing = client.get(urls("tickets.Ticket")["changelist"]).content.decode()
    assert str(root.id) in listing and str(strangers_ticket.id) not in listing
    # A stranger's ticket is as absent as an unknown one; its turn, events and
    # endpoint too.
    absent = client.get(urls("tickets.Ticket", strangers_ticket.pk)["change"])
    assert absent.status_code == 302 and absent["Location"] == reverse("admin:index")
    told = client.get(absent["Location"]).content.decode()
    assert "doesn’t exist" in told and "adm-other" not in told  # as for an unknown id
    assert client.get(urls("tickets.Ticket", root.pk)["change"]).status_code == 200
    events = client.get(urls("tickets.TicketEvent")["changelist"], {"q": str(strangers_ticket.id)})
    assert b"0 results" in events.content and b"admitted" not in events.content
    endpoints = client.get(urls("endpoints.Endpoint")["changelist"]).content.decode()
    assert "adm-echo" in endpoints and "adm-other" not in endpoints
    for label in MODELS:  # every list renders for the owner, with their rows only
        assert client.get(urls(label)["changelist"]).status_code == 200, label

    # Read-only for owners as for staff.
    u = urls("tickets.Ticket", root.pk)
    assert client.post(u["change"], {"_save": "Save"}).status_code == 403
    assert client.post(u["delete"], {"post": "yes"}).status_code == 403
    assert client.get(u["add"]).status_code == 403
    assert client.get(reverse("admin:auth_user_changelist")).status_code == 403


def test_a_member_who_owns_nothing_is_not_let_in(client, records, django_user_model):
    django_user_model.objects.create_user("member", password="pw-member-1")
    login = client.post(reverse("admin:login"), {"username": "member", "password": "pw-member-1"})
    assert login.status_code == 200
    assert b"Please enter the correct username and password" in login.content
    client.force_login(django_user_model.objects.get(username="member"))
    assert client.get(reverse("admin:index")).status_code == 302  # to the admin's login
    assert client.get(urls("tickets.Ticket")["changelist"]).status_code == 302
