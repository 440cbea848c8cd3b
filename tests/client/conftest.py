"""Fixtures for the Python client's tests: the real app behind pytest-django's
``live_server`` (real PostgreSQL), a real worker where a ticket must run, and
the few ledger reads and set-ups the tests check against. The test modules
themselves import only the client (Django stays in here)."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from urllib.parse import urlsplit

import pytest

from tests.conftest import wait_for

from .helpers import Proxy, Recorder

SECRET = "whsec_" + base64.b64encode(b"claimcheck client test key, 32 b").decode()


@pytest.fixture
def server(live_server) -> str:
    """The live server's base URL (the client adds ``/api/v1``)."""
    return live_server.url


@pytest.fixture
def proxy(live_server):
    """``proxy(plan)``: a fault-making proxy in front of the live server."""
    parts = urlsplit(live_server.url)
    made: list[Proxy] = []

    def make(plan: list[str], retry_after: str = "1") -> Proxy:
        made.append(Proxy((parts.hostname, parts.port), plan, retry_after=retry_after))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture
def recorder():
    """``recorder(status)``: a local HTTP server that records what it is sent."""
    made: list[Recorder] = []

    def make(status: int = 202, reply: bytes = b"") -> Recorder:
        made.append(Recorder(status, reply))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def user_key(transactional_db):
    """``user_key(username)``: an API key of a plain (not staff) user."""
    from accounts.keys import create_api_key

    def make(username: str) -> str:
        return create_api_key(username=username)[1]

    return make


@pytest.fixture
def endpoint(make_endpoint):
    """``endpoint(address, path=..., **kw)`` through the endpoint service; returns the address."""

    def make(address: str, **kw) -> str:
        return make_endpoint(address, **kw).address

    return make


class Ledger:
    """Reads of the database, to check what the server really recorded."""

    def tickets(self, **filters) -> list[dict]:
        from tickets.models import Ticket

        return list(
            Ticket.objects.filter(**filters).values("id", "dedupe_key", "state", "endpoint_id")
        )

    def events(self, ticket_id) -> list[str]:
        from tickets.models import LedgerEvent

        return list(
            LedgerEvent.objects.filter(ticket_id=ticket_id)
            .order_by("id")
            .values_list("kind", flat=True)
        )

    def event_ids(self, ticket_id) -> list[tuple[int, str]]:
        """The ticket's events as (id, kind), in id order."""
        from tickets.models import LedgerEvent

        return list(
            LedgerEvent.objects.filter(ticket_id=ticket_id).order_by("id").values_list("id", "kind")
        )

    def admit_without_key(self, endpoint: str, input: dict) -> str:  # noqa: A002
        from tickets.admission import admit_ticket

        return str(admit_ticket(endpoint=endpoint, input=input).ticket.id)

    def quarantine(self, address: str) -> str:
        """Drive ``address``'s next turn into quarantine with the runtime's
        own steps (start, interrupt, grace runs out); returns the case id."""
        from runtime import turns as runtime
        from tickets.admission import admit_ticket

        ticket = admit_ticket(endpoint=address, input={"seconds": 60}).ticket
        started = runtime.start_turn(ticket_id=ticket.id)
        assert started is not None and started.ticket.id == ticket.id
        assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
        case = wait_for(
            lambda: runtime.quarantine_turn(turn_id=started.turn.id),
            timeout=10,
            message="the turn to be quarantined",
        )
        return str(case)


@pytest.fixture
def ledger(transactional_db) -> Ledger:
    return Ledger()


@pytest.fixture
def webhook_secret() -> str:
    return SECRET


@pytest.fixture
def server_signature(settings):
    """``sign(body, at=None) -> headers`` with the server's own signing code
    (tickets.delivery, the standardwebhooks library) and ``SECRET``."""
    from django.utils import timezone

    from tickets import delivery

    settings.DELIVERY_SIGNING_SECRET = SECRET

    def sign(body: str, at: datetime | None = None, delivery_id: uuid.UUID | None = None):
        return delivery.signed_headers(
            webhook=delivery.signer(),
            delivery_id=delivery_id or uuid.uuid4(),
            body=body,
            at=at or timezone.now(),
        )

    return sign


@pytest.fixture
def loopback_allowed(monkeypatch, settings):
    """Loopback agents and receivers allowed by the URL policy, here and in
    the workers started after this fixture (subprocesses read the environment)."""
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    monkeypatch.setenv("DELIVERY_ALLOWED_HOSTS", "127.0.0.1")


@pytest.fixture
def delivery_worker(monkeypatch, settings, celery_procs):
    """A real worker and beat that may deliver to a loopback receiver and
    sign with ``SECRET`` (subprocesses read the environment); admission in
    the live server (this process) allows the loopback receiver too."""
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.DELIVERY_SIGNING_SECRET = SECRET
    monkeypatch.setenv("DELIVERY_ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setenv("DELIVERY_SIGNING_SECRET", SECRET)
    celery_procs.worker_and_beat()
    return celery_procs
