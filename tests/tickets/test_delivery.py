"""Delivery to the requester: signed webhooks with retries and an attempt log,
the URL policy, the approval gate, pull acknowledgement, obligations and
their sweep. The retry logic is driven in-process against a real local
HTTP receiver; one test runs the whole path through a real Celery worker."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import socket
import threading
import time
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from accounts.keys import create_api_key
from core import outbound
from core.dispatch import DELIVER
from core.errors import Invalid
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import purge_broker, queued_tasks, wait_for
from tickets import delivery, tasks
from tickets.delivery import states as delivery_states
from tickets.delivery import sweep as delivery_sweep
from tickets.models import Delivery, DeliveryAttempt, LedgerEvent, Ticket, TicketEvent

pytestmark = pytest.mark.django_db

SECRET = "whsec_" + base64.b64encode(b"claimcheck delivery test key 32b").decode()
RECEIVER = override_settings(
    DELIVERY_SIGNING_SECRET=SECRET,
    DELIVERY_ALLOWED_HOSTS=["127.0.0.1"],
    # Tiny backoff so in-process tests can step through retries without waiting.
    DELIVERY_BACKOFF_BASE_S=0.001,
    DELIVERY_BACKOFF_CAP_S=0.01,
)


# --- A local webhook receiver ---------------------------------------------------------------


class Receiver:
    """An HTTP server on 127.0.0.1 (port 0) answering ``statuses`` in order,
    then ``then``; it records every request's headers and body. ``host`` and
    ``port`` bind elsewhere on the loopback; ``location`` goes out as the
    Location header (for redirects)."""

    def __init__(
        self,
        *statuses: int,
        then: int = 200,
        delay_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        location: str | None = None,
    ) -> None:
        self.statuses = list(statuses)
        self.then = then
        self.delay_s = delay_s
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else receiver.then
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)  # the behaviour under test: a slow receiver
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.server.server_address[0]}:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(*statuses: int, **options) -> Receiver:
        made.append(Receiver(*statuses, **options))
        return made[-1]

    yield make
    for r in made:
        r.close()


def verified(request: tuple[dict[str, str], bytes]) -> dict:
    """What a receiver does with the reference library: raises if the
    signature, id or timestamp headers are wrong."""
    headers, body = request
    return Webhook(SECRET).verify(body, headers)


# --- Helpers --------------------------------------------------------------------------------


def admit(api, endpoint: str, webhook_url: str | None = None, **body) -> dict:
    payload = {"endpoint": endpoint, "input": {"n": 1}, **body}
    if webhook_url:
        payload["requester"] = {"name": "tester", "webhook_url": webhook_url}
    resp = api.post("/tickets", payload)
    assert resp.status_code == 201, resp.content
    return resp.json()


def finish(ticket_id: str) -> Ticket:
    """Run the ticket's turn in this process (the runner is demo.echo)."""
    runtime.run_ticket(ticket_id=uuid.UUID(ticket_id))
    ticket = Ticket.objects.get(id=ticket_id)
    assert ticket.is_terminal, ticket.state
    return ticket


def _due(delivery_id) -> bool:
    """The delivery's backoff (capped tiny here) has passed, or none is set."""
    due = Delivery.objects.values_list("next_attempt_at", flat=True).get(id=delivery_id)
    return due is None or due <= timezone.now()


def drive(delivery_id, *, until: set[str], attempts: int = 20) -> Ticket:
    """Call the worker's send repeatedly (the backoff is tiny here) until the
    ticket's delivery state is one of ``until``; fail if it never is."""
    deadline = time.monotonic() + 20
    for _ in range(attempts):
        ticket = Ticket.objects.get(delivery__id=delivery_id)
        if ticket.delivery_state in until:
            return ticket
        if time.monotonic() > deadline:
            break
        delivery.send(delivery_id=delivery_id)
        wait_for(lambda: _due(delivery_id), interval=0.005, message="the next attempt to be due")
    ticket = Ticket.objects.get(delivery__id=delivery_id)
    assert ticket.delivery_state in until, ticket.delivery_state
    return ticket


def kinds(ticket_id) -> list[str]:
    return list(LedgerEvent.objects.filter(ticket_id=ticket_id).values_list("kind", flat=True))


def user_api(api, username: str, *, staff: bool = False):
    _, key = create_api_key(username=username, staff=staff)
    return api.as_key(key)


# --- Webhook delivery -----------------------------------------------------------------------


@RECEIVER
def test_webhook_retries_with_the_same_id_until_2xx_and_logs_every_attempt(
    api, make_endpoint, receiver
):
    make_endpoint("alpha")
    hook = receiver(500, 500, then=200)
    body = admit(api, "alpha", hook.url)
    ticket = finish(body["id"])
    d = Delivery.objects.get(ticket=ticket)
    assert (d.mode, ticket.delivery_state) == ("webhook", "pending")

    ticket = drive(d.id, until={"delivered", "failed"})

    assert ticket.delivery_state == "delivered"
    assert ticket.state == "succeeded"  # delivery never changes the work state
    assert ticket.obligation_state == "closed"
    assert len(hook.requests) == 3
    ids = {headers["webhook-id"] for headers, _ in hook.requests}
    assert ids == {str(d.id)}
    for request in hook.requests:
        payload = verified(request)
        assert payload["ticket"]["id"] == body["id"]
        assert payload["ticket"]["result"] == {"echo": {"n": 1}}
        assert request[0]["webhook-signature"].startswith("v1,")
    log = list(DeliveryAttempt.objects.filter(delivery=d).order_by("number"))
    assert [(a.number, a.status_code) for a in log] == [(1, 500), (2, 500), (3, 200)]
    assert all(a.latency_ms is not None and a.latency_ms >= 0 for a in log)
    assert log[0].error == "receiver answered 500" and log[2].error == ""
    assert kinds(ticket.id).count("delivery_attempted") == 2
    assert kinds(ticket.id)[-1] == "delivered"
    shown = api.get(f"/tickets/{body['id']}").json()
    assert shown["delivery"] == {"state": "delivered", "attempts": 3}
    assert shown["obligation"]["state"] == "closed"
    # Delivered: another message for it sends nothing.
    assert delivery.send(delivery_id=d.id) is None
    assert len(hook.requests) == 3


def test_a_tampered_body_fails_verification(api, make_endpoint, receiver):
    """The verify above can fail: the signature covers id, timestamp and body."""
    with RECEIVER:
        make_endpoint("alpha")
        hook = receiver()
        ticket = finish(admit(api, "alpha", hook.url)["id"])
        drive(Delivery.objects.get(ticket=ticket).id, until={"delivered"})
    headers, body = hook.requests[0]
    from standardwebhooks.webhooks import WebhookVerificationError

    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b'"n":1', b'"n":2'), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, {**headers, "webhook-id": str(uuid.uuid4())})


@RECEIVER
def test_gone_stops_retrying(api, make_endpoint, receiver):
    make_endpoint("alpha")
    hook = receiver(then=410)
    ticket = finish(admit(api, "alpha", hook.url)["id"])
    d = Delivery.objects.get(ticket=ticket)
    ticket = drive(d.id, until={"failed", "delivered"})
    assert ticket.delivery_state == "failed" and ticket.state == "succeeded"
    assert len(hook.requests) == 1
    d.refresh_from_db()
    assert d.next_attempt_at is None and d.last_error == "receiver answered 410"
    assert delivery.send(delivery_id=d.id) is None
    assert len(hook.requests) == 1
    assert ticket.obligation_state == "open"  # nobody has the answer: still owed
    assert TicketEvent.objects.get(ticket=ticket, kind="delivery_failed").detail["why"] == "gone"


@RECEIVER
@override_settings(DELIVERY_MAX_ATTEMPTS=3)
def test_retries_stop_after_the_last_attempt(api, make_endpoint, receiver):
    make_endpoint("alpha")
    hook = receiver(then=503)
    ticket = finish(admit(api, "alpha", hook.url)["id"])
    d = Delivery.objects.get(ticket=ticket)
    ticket = drive(d.id, until={"failed", "delivered"})
    assert ticket.delivery_state == "failed"
    assert len(hook.requests) == 3
    assert list(
        DeliveryAttempt.objects.filter(delivery=d).values_list("status_code", flat=True)
    ) == [503, 503, 503]
    assert delivery.send(delivery_id=d.id) is None and len(hook.requests) == 3


@RECEIVER
def test_an_unreachable_receiver_is_an_attempt_with_an_error(api, make_endpoint):
    make_endpoint("alpha")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ticket = finish(admit(api, "alpha", f"http://127.0.0.1:{port}/hook")["id"])
    d = Delivery.objects.get(ticket=ticket)
    sent = delivery.send(delivery_id=d.id)
    assert sent is not None and sent.status_code is None and "ConnectError" in sent.error
    attempt = DeliveryAttempt.objects.get(delivery=d)
    assert attempt.status_code is None and "ConnectError" in attempt.error
    d.refresh_from_db()
    ticket.refresh_from_db()
    assert ticket.delivery_state == "attempted" and d.next_attempt_at is not None


def test_backoff_is_exponential_with_full_jitter_and_capped():
    with override_settings(DELIVERY_BACKOFF_BASE_S=2.0, DELIVERY_BACKOFF_CAP_S=600.0):
        for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (9, 512), (10, 600), (30, 600)]:
            samples = [delivery.backoff_s(attempt) for _ in range(200)]
            assert all(0 <= s <= ceiling for s in samples)
            assert max(samples) > ceiling / 2  # jittered over the whole range, not fixed
            assert min(samples) < ceiling / 2


@RECEIVER
def test_a_url_the_policy_refuses_at_send_time_fails_at_once(api, make_endpoint, receiver):
    """Checked again before each send; a refusal cannot be cured by retrying,
    so the delivery fails on that one attempt, which is logged with why."""
    make_endpoint("alpha")
    hook = receiver()
    ticket = finish(admit(api, "alpha", hook.url)["id"])
    d = Delivery.objects.get(ticket=ticket)
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]):
        sent = delivery.send(delivery_id=d.id)
    assert sent.status_code is None and sent.error.startswith("refused before sending")
    assert "127.0.0.1" in sent.error
    assert hook.requests == []  # no request left the process
    ticket.refresh_from_db()
    d.refresh_from_db()
    assert ticket.delivery_state == "failed" and d.next_attempt_at is None
    attempts = list(DeliveryAttempt.objects.filter(delivery=d))
    assert [(a.number, a.status_code) for a in attempts] == [(1, None)]
    assert attempts[0].error.startswith("refused before sending")
    failed = TicketEvent.objects.get(ticket=ticket, kind="delivery_failed")
    assert failed.detail["why"] == "refused by the URL policy"
    assert delivery.send(delivery_id=d.id) is None  # nothing is owed any more


@RECEIVER
@pytest.mark.django_db(transaction=True)
def test_two_workers_never_send_the_same_attempt(api, make_endpoint, receiver):
    make_endpoint("alpha")
    hook = receiver(delay_s=0.3)  # slow: both workers are in send at once
    ticket = finish(admit(api, "alpha", hook.url)["id"])
    d = Delivery.objects.get(ticket=ticket)
    n = 6
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = delivery.send(delivery_id=d.id)
        except Exception as exc:  # surfaced by the assertions
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(1 for r in results if r is not None) == 1
    assert len(hook.requests) == 1
    assert DeliveryAttempt.objects.filter(delivery=d).count() == 1
    ticket.refresh_from_db()
    assert ticket.delivery_state == "delivered"


@RECEIVER
def test_delivery_attempts_are_append_only(api, make_endpoint, receiver):
    make_endpoint("alpha")
    ticket = finish(admit(api, "alpha", receiver().url)["id"])
    drive(Delivery.objects.get(ticket=ticket).id, until={"delivered"})
    attempt = DeliveryAttempt.objects.get(delivery__ticket=ticket)
    with pytest.raises(DatabaseError), transaction.atomic():
        DeliveryAttempt.objects.filter(id=attempt.id).update(status_code=500)
    with pytest.raises(DatabaseError), transaction.atomic():
        DeliveryAttempt.objects.filter(id=attempt.id).delete()
    assert DeliveryAttempt.objects.get(id=attempt.id).status_code == 200


def test_a_finished_root_opens_one_delivery_and_publishes_its_send(
    api, make_endpoint, django_capture_on_commit_callbacks
):
    purge_broker()
    make_endpoint("alpha")
    with RECEIVER:
        body = admit(api, "alpha", "http://127.0.0.1:9/hook")
        with django_capture_on_commit_callbacks(execute=True):
            ticket = finish(body["id"])
    d = Delivery.objects.get(ticket=ticket)
    assert queued_tasks("control") == [(DELIVER, [str(d.id)])]  # real Redis
    assert d.next_attempt_at is not None  # the sweep finds it if the publish is lost
    # Idempotent: opening it again finds the row open and writes nothing.
    events = kinds(ticket.id)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT * FROM claimcheck_open_delivery(p_ticket => %s, p_delivery => %s,"
            " p_now => now())",
            [ticket.id, uuid.uuid4()],
        )
        assert cur.fetchall() == []
    assert kinds(ticket.id) == events and Delivery.objects.filter(ticket=ticket).count() == 1
    # The terminal event records the delivery it opened: one event for the
    # one transaction (issue 12), in the same words on both finish paths.
    terminal = TicketEvent.objects.get(ticket_id=ticket.id, kind="turn_completed")
    # Its mode and state: the ticket's one delivery is named by the ticket.
    assert terminal.detail["delivery_opened"] == {"mode": "webhook", "state": "pending"}
    assert events == ["admitted", "turn_started", "turn_completed"]


def test_a_transition_to_a_terminal_state_records_the_delivery_it_opened(api, make_endpoint):
    """The general path (a queued ticket cancelled; a turn's finish off the
    fast path goes the same way) records its delivery in the terminal event,
    as the finish statement does: no event of its own."""
    make_endpoint("alpha")
    ticket_id = admit(api, "alpha")["id"]
    runtime_services.cancel_ticket(ticket_id=uuid.UUID(ticket_id), actor="test")
    d = Delivery.objects.get(ticket_id=ticket_id)
    assert kinds(ticket_id) == ["admitted", "cancelled"]
    cancelled = TicketEvent.objects.get(ticket_id=ticket_id, kind="cancelled")
    assert cancelled.detail["delivery_opened"] == {"mode": "pull", "state": "pending"}
    assert d.mode == "pull"
    assert Ticket.objects.get(id=ticket_id).delivery_state == "pending"


def test_children_have_no_delivery(api, make_endpoint):
    make_endpoint("alpha")
    root = admit(api, "alpha")
    child = api.post("/tickets", {"endpoint": "alpha", "input": {}, "parent": root["id"]}).json()
    finish(root["id"])
    finish(child["id"])
    assert Delivery.objects.filter(ticket_id=child["id"]).count() == 0
    assert Ticket.objects.get(id=child["id"]).delivery_state == "none"
    assert Delivery.objects.filter(ticket_id=root["id"]).count() == 1


def test_the_delivery_sweep_publishes_due_deliveries_only(
    api, make_endpoint, django_capture_on_commit_callbacks
):
    make_endpoint("alpha")
    with RECEIVER:
        due = finish(admit(api, "alpha", "http://127.0.0.1:9/a")["id"])
        later = finish(admit(api, "alpha", "http://127.0.0.1:9/b")["id"])
    pull = finish(admit(api, "alpha")["id"])
    # A retry scheduled five minutes from now is not due yet.
    Delivery.objects.filter(ticket=later).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    purge_broker()
    with django_capture_on_commit_callbacks(execute=True):
        tasks.sweep_deliveries()
    assert queued_tasks("control") == [(DELIVER, [str(Delivery.objects.get(ticket=due).id)])]
    assert Delivery.objects.get(ticket=pull).next_attempt_at is None


# --- URL policy -----------------------------------------------------------------------------


REFUSED = [
    "http://127.0.0.1:9/x",
    "http://localhost/x",
    "http://[::1]/x",
    "http://[::ffff:127.0.0.1]/x",
    # IPv6 forms that carry a non-public IPv4 address: 6to4 of loopback and
    # of a private address, Teredo, NAT64 of loopback and local-use NAT64.
    "http://[2002:7f00:1::]/x",
    "http://[2002:a00:1::1]/x",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fefe]/x",
    "http://[64:ff9b::7f00:1]/x",
    "http://[64:ff9b:1::808:808]/x",
    "http://10.1.2.3/x",
    "http://192.168.0.10/x",
    "http://172.16.5.4/x",
    "http://169.254.169.254/latest/meta-data",
    "http://100.64.0.1/x",
    "http://0.0.0.0/x",
    "http://224.0.0.1/x",
    "ftp://93.184.215.14/x",
    "file:///etc/passwd",
    "http:///no-host",
    "http://93.184.215.14:99999/x",
    "not a url",
    "",
]


@pytest.mark.parametrize("url", REFUSED)
def test_private_and_odd_urls_are_refused(url):
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]), pytest.raises(Invalid) as info:
        delivery.validate_webhook_url(url)
    assert info.value.detail


def test_a_public_address_is_accepted():
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]):
        delivery.validate_webhook_url("https://93.184.215.14/hook")
        delivery.validate_webhook_url("http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8080/h")
        # 6to4 and NAT64 forms of a public IPv4 address are public.
        delivery.validate_webhook_url("http://[2002:5db8:d70e::1]/h")
        delivery.validate_webhook_url("http://[64:ff9b::5db8:d70e]/h")


def fake_dns(monkeypatch, table: dict[str, list[str]]) -> None:
    """DNS outside the machine answers from ``table``; address literals
    resolve as usual (socket.create_connection looks them up too)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return real(host, port, *args, **kwargs)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in table[host]]

    monkeypatch.setattr(outbound.socket, "getaddrinfo", getaddrinfo)


def test_every_resolved_address_must_be_public(monkeypatch):
    fake_dns(
        monkeypatch,
        {
            "hooks.example.com": ["93.184.215.14"],
            "split.example.com": ["93.184.215.14", "10.0.0.7"],
            "inside.example.com": ["127.0.0.1"],
        },
    )
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]):
        delivery.validate_webhook_url("https://hooks.example.com/x")
        with pytest.raises(Invalid, match="10.0.0.7"):
            delivery.validate_webhook_url("https://split.example.com/x")
        with pytest.raises(Invalid, match="not a public address"):
            delivery.validate_webhook_url("https://inside.example.com/x")
        with pytest.raises(Invalid, match="does not resolve"):
            delivery.validate_webhook_url("https://nowhere.example.com/x")


def test_an_allow_list_admits_only_its_hosts_private_ones_included(monkeypatch):
    fake_dns(monkeypatch, {"hooks.example.com": ["93.184.215.14"]})
    with override_settings(DELIVERY_ALLOWED_HOSTS=["127.0.0.1", ".internal.example"]):
        delivery.validate_webhook_url("http://127.0.0.1:9/x")
        delivery.validate_webhook_url("https://a.internal.example/x")
        delivery.validate_webhook_url("https://internal.example/x")
        with pytest.raises(Invalid, match="not in DELIVERY_ALLOWED_HOSTS"):
            delivery.validate_webhook_url("https://hooks.example.com/x")
        with pytest.raises(Invalid, match="not in DELIVERY_ALLOWED_HOSTS"):
            delivery.validate_webhook_url("http://localhost/x")


def test_admission_refuses_a_loopback_webhook_unless_listed(api, make_endpoint):
    make_endpoint("alpha")
    body = {"endpoint": "alpha", "input": {}, "requester": {"webhook_url": "http://127.0.0.1:9/"}}
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]):
        resp = api.post("/tickets", body)
    assert resp.status_code == 400 and resp.json()["error"] == "invalid"
    assert "127.0.0.1" in resp.json()["detail"]
    assert Ticket.objects.count() == 0
    with override_settings(DELIVERY_ALLOWED_HOSTS=["127.0.0.1"]):
        assert api.post("/tickets", body).status_code == 201


# --- Approval gate ----------------------------------------------------------------------------


@RECEIVER
def test_delivery_waits_for_an_owner_to_approve(api, make_endpoint, receiver, monkeypatch):
    published = []
    real_publish = delivery_states.publish

    def recording(name, *a, **kw):
        published.append(a)
        real_publish(name, *a)

    # Every module of the delivery package that publishes: the state machine
    # (open, approve) and the sweep.
    monkeypatch.setattr(delivery_states, "publish", recording)
    monkeypatch.setattr(delivery_sweep, "publish", recording)
    owner = user_api(api, "olive")
    stranger = user_api(api, "mallory")
    make_endpoint("gated", owners=["olive"], requires_approval=True)
    hook = receiver()
    body = admit(api, "gated", hook.url)
    queued = admit(api, "gated", hook.url)  # stays queued: the turn below takes the oldest

    resp = owner.post(f"/tickets/{queued['id']}/approve")
    assert resp.status_code == 409 and resp.json()["error"] == "invalid_transition"
    assert resp.json()["state"] == "queued"

    ticket = finish(body["id"])
    d = Delivery.objects.get(ticket=ticket)
    assert ticket.delivery_state == "awaiting_approval" and d.next_attempt_at is None
    assert published == []
    assert delivery.send(delivery_id=d.id) is None and hook.requests == []

    # A stranger does not see the ticket at all (404, as for an unknown id).
    resp = stranger.post(f"/tickets/{body['id']}/approve")
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    assert Ticket.objects.get(id=body["id"]).approved_at is None

    resp = owner.post(f"/tickets/{body['id']}/approve")
    assert resp.status_code == 200, resp.content
    assert resp.json()["delivery"]["state"] == "pending"
    ticket.refresh_from_db()
    assert ticket.approved_by.username == "olive" and ticket.approved_at is not None
    assert published == [(str(d.id),)]

    drive(d.id, until={"delivered"})
    assert len(hook.requests) == 1 and verified(hook.requests[0])["ticket"]["id"] == body["id"]

    # Approving again is a no-op: same approver, no second event.
    again = api.post(f"/tickets/{body['id']}/approve")  # staff acts as owner
    assert again.status_code == 200 and again.json()["delivery"]["state"] == "delivered"
    assert kinds(ticket.id).count("approved") == 1
    assert Ticket.objects.get(id=body["id"]).approved_by.username == "olive"


def test_approving_a_ticket_that_needs_no_approval_is_refused(api, make_endpoint):
    make_endpoint("alpha")
    ticket = finish(admit(api, "alpha")["id"])
    resp = api.post(f"/tickets/{ticket.id}/approve")
    assert resp.status_code == 409 and resp.json()["error"] == "invalid_transition"
    assert resp.json()["state"] == "succeeded"


# --- Pull delivery ------------------------------------------------------------------------------


def test_pull_delivery_is_acknowledged_once(api, make_endpoint):
    make_endpoint("alpha")
    body = admit(api, "alpha")
    early = api.post(f"/tickets/{body['id']}/delivery/ack", {})
    assert early.status_code == 409 and early.json()["state"] == "queued"

    ticket = finish(body["id"])
    d = Delivery.objects.get(ticket=ticket)
    assert d.mode == "pull" and ticket.delivery_state == "pending"
    assert delivery.send(delivery_id=d.id) is None  # nothing to send for pull

    resp = api.post(f"/tickets/{body['id']}/delivery/ack", {"note": "got it"})
    assert resp.status_code == 200, resp.content
    assert resp.json()["delivery"]["state"] == "delivered"
    assert resp.json()["obligation"]["state"] == "closed"
    assert resp.json()["state"] == "succeeded"
    assert kinds(ticket.id).count("delivery_acknowledged") == 1

    twice = api.post(f"/tickets/{body['id']}/delivery/ack", {})
    assert twice.status_code == 409 and twice.json()["error"] == "invalid_transition"


@RECEIVER
def test_a_webhook_delivery_cannot_be_acknowledged_by_pull(api, make_endpoint):
    make_endpoint("alpha")
    body = admit(api, "alpha", "http://127.0.0.1:9/hook")
    finish(body["id"])
    resp = api.post(f"/tickets/{body['id']}/delivery/ack", {})
    assert resp.status_code == 409 and resp.json()["delivery"] == "pending"


def test_a_gated_pull_delivery_cannot_be_acknowledged_before_approval(api, make_endpoint):
    make_endpoint("gated", requires_approval=True)
    body = admit(api, "gated")
    finish(body["id"])
    resp = api.post(f"/tickets/{body['id']}/delivery/ack", {})
    assert resp.status_code == 409 and resp.json()["delivery"] == "awaiting_approval"
    assert api.post(f"/tickets/{body['id']}/approve").status_code == 200
    assert api.post(f"/tickets/{body['id']}/delivery/ack", {}).status_code == 200


# --- Obligations --------------------------------------------------------------------------------


def test_the_sweep_flags_overdue_obligations_once(api, make_endpoint):
    make_endpoint("alpha")
    with override_settings(OBLIGATION_UPDATE_INTERVAL_S=0):
        overdue = admit(api, "alpha")
    fresh = admit(api, "alpha")  # due in an hour
    child = api.post("/tickets", {"endpoint": "alpha", "input": {}, "parent": overdue["id"]})

    tasks.sweep_obligations()
    tasks.sweep_obligations()  # a second round adds nothing

    shown = api.get(f"/tickets/{overdue['id']}").json()["obligation"]
    assert shown["state"] == "open" and shown["overdue"] is True
    assert kinds(overdue["id"]).count("obligation_overdue") == 1
    assert api.get(f"/tickets/{fresh['id']}").json()["obligation"]["overdue"] is False
    assert "obligation_overdue" not in kinds(fresh["id"])
    assert api.get(f"/tickets/{child.json()['id']}").json()["obligation"]["state"] == "none"

    # A new update time clears the flag; the next sweep leaves it alone.
    later = (timezone.now() + timedelta(hours=2)).isoformat()
    resp = api.post(
        f"/tickets/{overdue['id']}/obligation",
        {"next_update_at": later, "note": "waiting on the vendor"},
    )
    assert resp.status_code == 200, resp.content
    assert resp.json()["obligation"]["overdue"] is False
    assert resp.json()["obligation"]["note"] == "waiting on the vendor"
    tasks.sweep_obligations()
    assert kinds(overdue["id"]).count("obligation_overdue") == 1


def test_obligation_updates_are_for_owners_and_checked(api, make_endpoint):
    owner = user_api(api, "olive")
    stranger = user_api(api, "mallory")
    make_endpoint("alpha", owners=["olive"])
    body = admit(api, "alpha")
    path = f"/tickets/{body['id']}/obligation"
    future = (timezone.now() + timedelta(hours=1)).isoformat()

    # Not visible to a stranger: 404 (a submitter who owns nothing gets 403:
    # tests/test_authorization.py).
    assert stranger.post(path, {"note": "x"}).status_code == 404
    assert stranger.post(f"{path}/close", {"note": "x"}).status_code == 404
    past = owner.post(path, {"next_update_at": "2001-01-01T00:00:00Z"})
    assert past.status_code == 400 and past.json()["error"] == "invalid"
    assert owner.post(path, {}).status_code == 400
    assert owner.post(path, {"colour": "red"}).status_code == 422
    assert owner.post(f"{path}/close", {}).status_code == 422  # a note is required
    assert owner.post(path, {"next_update_at": future}).status_code == 200
    # An offset PostgreSQL refuses (beyond 15:59; found by the schema fuzz,
    # a 500 before) is converted to UTC; one that leaves year 9999 is 400.
    far = owner.post(path, {"next_update_at": "3496-06-23T04:43:26-20:35"})
    assert far.status_code == 200, far.content
    assert far.json()["obligation"]["next_update_at"] == "3496-06-24T01:18:26Z"
    edge = owner.post(path, {"next_update_at": "9999-12-31T23:00:00-20:35"})
    assert edge.status_code == 400 and "next_update_at" in edge.json()["detail"]

    closed = owner.post(f"{path}/close", {"note": "requester withdrew the request"})
    assert closed.status_code == 200, closed.content
    assert closed.json()["obligation"] == {
        "state": "closed",
        "next_update_at": None,
        "overdue": False,
        "note": "requester withdrew the request",
    }
    assert closed.json()["state"] == "queued"  # the work goes on
    again = owner.post(f"{path}/close", {"note": "again"})
    assert again.status_code == 409 and again.json()["error"] == "invalid_transition"
    assert owner.post(path, {"note": "late"}).status_code == 409
    assert [k for k in kinds(body["id"]) if k.startswith("obligation")] == [
        "obligation_updated",
        "obligation_updated",
        "obligation_closed",
    ]

    # Delivered later: the closed obligation stays closed, delivery is recorded.
    finish(body["id"])
    ack = api.post(f"/tickets/{body['id']}/delivery/ack", {})
    assert ack.status_code == 200 and ack.json()["obligation"]["state"] == "closed"


def test_a_child_has_no_obligation_to_close(api, make_endpoint):
    make_endpoint("alpha")
    root = admit(api, "alpha")
    child = api.post("/tickets", {"endpoint": "alpha", "input": {}, "parent": root["id"]}).json()
    resp = api.post(f"/tickets/{child['id']}/obligation/close", {"note": "n/a"})
    assert resp.status_code == 409 and resp.json()["obligation"] == "none"


def test_unknown_ticket_obligation_is_not_found(api):
    resp = api.post(f"/tickets/{uuid.uuid4()}/obligation/close", {"note": "x"})
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"


# --- The whole path through a real worker -------------------------------------------------------


@pytest.fixture
def delivery_worker(monkeypatch, celery_procs):
    """A worker and beat that allow the loopback receiver and sign with the
    test key (the subprocesses read the environment, not override_settings)."""
    monkeypatch.setenv("DELIVERY_ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setenv("DELIVERY_SIGNING_SECRET", SECRET)
    celery_procs.worker_and_beat()
    return celery_procs


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_delivers_after_retries(api, make_endpoint, receiver, delivery_worker):
    make_endpoint("alpha")
    hook = receiver(500, 500, then=200)
    with RECEIVER:
        body = admit(api, "alpha", hook.url)

    def delivered():
        t = api.get(f"/tickets/{body['id']}").json()
        return t if t["delivery"]["state"] in ("delivered", "failed") else None

    # Default backoff (base 2 s, full jitter): the retries are due within ~6 s
    # and beat's 0.5 s delivery sweep publishes them.
    shown = wait_for(delivered, timeout=60, message="webhook delivery")
    assert shown["delivery"] == {"state": "delivered", "attempts": 3}, (
        shown,
        delivery_worker.log("turns")[-3000:].decode(errors="replace"),
    )
    assert shown["state"] == "succeeded" and shown["obligation"]["state"] == "closed"
    assert len(hook.requests) == 3
    d = Delivery.objects.get(ticket_id=body["id"])
    assert {h["webhook-id"] for h, _ in hook.requests} == {str(d.id)}
    for request in hook.requests:
        assert verified(request)["ticket"]["id"] == body["id"]
    statuses = list(
        DeliveryAttempt.objects.filter(delivery=d).values_list("status_code", flat=True)
    )
    assert statuses == [500, 500, 200]
    attempts = TicketEvent.objects.filter(ticket_id=body["id"], kind="delivery_attempted")
    gaps = [e.detail["next_attempt_at"] for e in attempts]
    assert len(gaps) == 2
    assert json.loads(json.dumps(shown))  # the API still renders it


# --- The connection goes to the address that was checked ----------------------------------


class ChangingDns:
    """A resolver outside the machine whose answer for ``name`` changes:
    ``first`` for the first lookup, ``then`` for every later one (a
    DNS-rebinding attacker's short-TTL record). Address literals resolve as
    usual (socket.create_connection looks them up too)."""

    def __init__(self, monkeypatch, name: str, first: str, then: str) -> None:
        self.name, self.answers, self.lookups = name, [first, then], 0
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            if host != self.name:
                return real(host, port, *args, **kwargs)
            self.lookups += 1
            ip = self.answers[0] if self.lookups == 1 else self.answers[1]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@RECEIVER
def test_a_rebinding_host_is_not_resolved_again_after_the_check(
    api, make_endpoint, receiver, monkeypatch
):
    """The host first resolves to an address the policy accepts and then to
    one it refuses. The send must connect to the checked address; a second
    lookup at connect time would reach the refused one.

    No public address may be contacted from here, so 127.0.0.1 stands in for
    "a public address" (the policy's verdict is patched for it) and
    127.0.0.2 for the internal target, on the same port."""
    make_endpoint("alpha")
    checked = receiver()
    internal = receiver(host="127.0.0.2", port=checked.port)
    url = f"http://hooks.example.com:{checked.port}/hook"
    with override_settings(DELIVERY_ALLOWED_HOSTS=["hooks.example.com"]):
        ticket = finish(admit(api, "alpha", url)["id"])  # admitted while listed
    d = Delivery.objects.get(ticket=ticket)

    monkeypatch.setattr(outbound, "is_public", lambda ip: str(ip) == "127.0.0.1")
    dns = ChangingDns(monkeypatch, "hooks.example.com", first="127.0.0.1", then="127.0.0.2")
    with override_settings(DELIVERY_ALLOWED_HOSTS=[]):
        sent = delivery.send(delivery_id=d.id)

    assert internal.requests == [], "the send resolved the host again and reached 127.0.0.2"
    assert sent.ok, sent.error
    assert dns.lookups == 1
    headers, _ = checked.requests[0]
    assert headers["Host"] == f"hooks.example.com:{checked.port}"  # the URL's host, kept
    verified(checked.requests[0])


@RECEIVER
def test_a_listed_host_is_resolved_once_and_pinned(api, make_endpoint, receiver, monkeypatch):
    make_endpoint("alpha")
    first = receiver()
    second = receiver(host="127.0.0.2", port=first.port)
    url = f"http://hooks.test:{first.port}/hook"
    with override_settings(DELIVERY_ALLOWED_HOSTS=["hooks.test"]):
        ticket = finish(admit(api, "alpha", url)["id"])
        d = Delivery.objects.get(ticket=ticket)
        dns = ChangingDns(monkeypatch, "hooks.test", first="127.0.0.1", then="127.0.0.2")
        sent = delivery.send(delivery_id=d.id)
    assert sent.ok and len(first.requests) == 1 and second.requests == []
    assert dns.lookups == 1


@RECEIVER
def test_a_host_that_does_not_resolve_at_send_time_is_retried(api, make_endpoint, monkeypatch):
    make_endpoint("alpha")
    with override_settings(DELIVERY_ALLOWED_HOSTS=["hooks.test"]):
        ticket = finish(admit(api, "alpha", "http://hooks.test/hook")["id"])
        d = Delivery.objects.get(ticket=ticket)
        fake_dns(monkeypatch, {})
        sent = delivery.send(delivery_id=d.id)
    assert sent.status_code is None and "does not resolve" in sent.error
    ticket.refresh_from_db()
    d.refresh_from_db()
    assert ticket.delivery_state == "attempted" and d.next_attempt_at is not None


@RECEIVER
def test_a_redirect_is_a_failed_attempt_and_is_not_followed(api, make_endpoint, receiver):
    make_endpoint("alpha")
    elsewhere = receiver()
    hook = receiver(then=307, location=elsewhere.url)
    ticket = finish(admit(api, "alpha", hook.url)["id"])
    d = Delivery.objects.get(ticket=ticket)
    sent = delivery.send(delivery_id=d.id)
    assert sent.status_code == 307 and not sent.ok
    assert "redirect" in sent.error and elsewhere.url in sent.error
    assert len(hook.requests) == 1 and elsewhere.requests == []
    ticket.refresh_from_db()
    assert ticket.delivery_state == "attempted"  # retried later, to the same URL
    attempt = DeliveryAttempt.objects.get(delivery=d)
    assert attempt.status_code == 307 and "not followed" in attempt.error


# --- HTTPS keeps the URL's host for SNI and the certificate check --------------------------


@pytest.fixture
def tls_receiver(tmp_path, monkeypatch):
    """An HTTPS receiver on 127.0.0.1 with a self-signed certificate for
    hooks.example.com, trusted through SSL_CERT_FILE (which httpx reads);
    it records the SNI name each handshake asked for."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=hooks.example.com",
            "-addext", "subjectAltName=DNS:hooks.example.com",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    hook = Receiver()
    names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    hook.server.socket = context.wrap_socket(hook.server.socket, server_side=True)
    hook.sni = names
    yield hook
    hook.close()


@RECEIVER
def test_https_to_a_pinned_address_keeps_sni_and_verifies_the_host(
    api, make_endpoint, tls_receiver, monkeypatch
):
    make_endpoint("alpha")
    port = tls_receiver.port
    with override_settings(DELIVERY_ALLOWED_HOSTS=["hooks.example.com", "other.example.com"]):
        good = finish(admit(api, "alpha", f"https://hooks.example.com:{port}/hook")["id"])
        bad = finish(admit(api, "alpha", f"https://other.example.com:{port}/hook")["id"])
        fake_dns(
            monkeypatch, {"hooks.example.com": ["127.0.0.1"], "other.example.com": ["127.0.0.1"]}
        )
        sent = delivery.send(delivery_id=Delivery.objects.get(ticket=good).id)
        assert sent.ok, sent.error
        assert tls_receiver.sni == ["hooks.example.com"]
        assert tls_receiver.requests[0][0]["Host"] == f"hooks.example.com:{port}"
        # The certificate names hooks.example.com: a URL naming another host
        # that resolves to the same address is refused by the TLS check.
        sent = delivery.send(delivery_id=Delivery.objects.get(ticket=bad).id)
    assert sent.status_code is None and "CERTIFICATE_VERIFY_FAILED" in sent.error
    assert len(tls_receiver.requests) == 1


@RECEIVER
def test_outbound_calls_share_one_tls_context_per_ca_setting(
    api, make_endpoint, receiver, monkeypatch
):
    """Building a verifying TLS context loads and parses the whole CA
    bundle: every webhook attempt built two. Now one per process and CA
    setting: three attempts build none after the first, and a changed
    SSL_CERT_FILE (which httpx reads) is honoured with a context of its own."""
    import ssl

    from core import outbound

    make_endpoint("alpha")
    hook = receiver(503, 503, then=204)
    d = Delivery.objects.get(ticket=finish(admit(api, "alpha", hook.url)["id"]))
    outbound._verifying_context.cache_clear()
    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(
        ssl, "create_default_context", lambda *a, **kw: built.append(kw) or real(*a, **kw)
    )
    ticket = drive(d.id, until={"delivered"})
    assert ticket.delivery_state == "delivered" and len(hook.requests) == 3
    assert len(built) == 1, built

    import certifi

    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    context = outbound.tls_context()
    assert built[-1] == {"cafile": certifi.where()} and len(built) == 2
    assert outbound.tls_context() is context
