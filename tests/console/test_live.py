"""Live regions wake on a notification (issue 12, console/views/live.py): a watch
waits, without a query, until a ticket event commits; it answers at once
when the page's token is already stale; a stranger's ticket is 404; the
slots per process bound the threads watches hold. Real PostgreSQL: every
ticket event notifies at commit (tickets/waits.py)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, connections
from django.test import Client

from console.owners import create_owner
from core.dispatch import DISPATCH_CHANNEL
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import listener_wakeups, wait_for, waiting_on
from tickets import selectors as ticket_selectors
from tickets import waits
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketState

pytestmark = [pytest.mark.django_db(transaction=True)]

URL = "/live/"


@pytest.fixture(autouse=True)
def _a_clean_listener(settings):
    settings.CONSOLE_LIVE_WAIT_S = 20
    yield
    waits.stop_listener()  # its session would keep the test database from being dropped


@pytest.fixture
def olive(make_endpoint):
    make_endpoint("live.a")
    make_endpoint("live.b")
    return create_owner(username="olive", password="pw-olive-1", endpoints=["live.a", "live.b"])


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class Watch:
    """A watch request in its own thread, as a browser tab holds one."""

    def __init__(self, user, **params):
        self.answer = None
        self.started = time.monotonic()
        self.took = None
        self._thread = threading.Thread(target=self._run, args=(user, params), daemon=True)
        self._thread.start()

    def _run(self, user, params):
        try:
            self.answer = logged_in(user).get(URL, params)
        finally:
            self.took = time.monotonic() - self.started
            connections.close_all()

    def result(self, timeout: float):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the watch did not answer within {timeout} s"
        return self.answer


def wait_until_waiting(key: str, deadline_s: float = 10) -> None:
    """Until a watch on ``key`` has subscribed (it then waits)."""
    wait_for(lambda: waiting_on(key), timeout=deadline_s, message=f"a watch on {key} to wait")


def test_a_watch_sleeps_until_the_tickets_event_commits(olive):
    ticket = admit_ticket(endpoint="live.a", input={}).ticket
    token = ticket_selectors.change_token(ticket.id)
    watch = Watch(olive, ticket=str(ticket.id), token=token)
    wait_until_waiting(str(ticket.id))
    listener_wakeups(20)  # it keeps waiting: nothing of its ticket changed
    assert watch.answer is None
    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="watch me")
    answer = watch.result(timeout=10).json()
    assert watch.took < 10  # woken, not timed out (CONSOLE_LIVE_WAIT_S is 20)
    assert answer == {
        "live": True,
        "changed": True,
        "token": ticket_selectors.change_token(ticket.id),
    }
    assert answer["token"] != token


def test_a_stale_token_answers_at_once(olive):
    ticket = admit_ticket(endpoint="live.a", input={}).ticket
    stale = ticket_selectors.change_token(ticket.id)
    runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="moved on")
    started = time.monotonic()
    answer = logged_in(olive).get(URL, {"ticket": str(ticket.id), "token": stale})
    assert time.monotonic() - started < 2
    assert answer.json()["changed"] is True
    assert answer["Cache-Control"] == "no-store"


def test_another_tickets_event_does_not_wake_a_ticket_watch(olive, settings):
    settings.CONSOLE_LIVE_WAIT_S = 2
    watched = admit_ticket(endpoint="live.a", input={}).ticket
    token = ticket_selectors.change_token(watched.id)
    watch = Watch(olive, ticket=str(watched.id), token=token)
    wait_until_waiting(str(watched.id))
    admit_ticket(endpoint="live.b", input={})
    answer = watch.result(timeout=10).json()
    assert answer == {"live": True, "changed": False, "token": token}
    assert watch.took >= 1.9  # it waited out its time


def test_a_ledger_watch_wakes_on_any_tickets_event(olive):
    token = ticket_selectors.ledger_change_token()
    watch = Watch(olive, token=token)
    wait_until_waiting(waits.ANY)
    admit_ticket(endpoint="live.b", input={})
    answer = watch.result(timeout=10).json()
    assert watch.took < 10
    assert answer["changed"] is True and answer["token"] != token


def test_every_path_that_writes_an_event_notifies(olive):
    """Seen from a LISTEN session of its own: an admission wakes the
    dispatcher, which stands for "a ticket was admitted" (the ledger's
    watches wake on it); the turn's start and finish statements and every
    event the ORM writes (a cancel) notify the ticket's id."""
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {waits.TICKET_CHANNEL}")
        listener.execute(f"LISTEN {DISPATCH_CHANNEL}")

        def heard_list():
            return [(n.channel, n.payload) for n in listener.notifies(timeout=1)]

        def heard():
            return set(heard_list())

        ran = admit_ticket(endpoint="live.a", input={}).ticket
        assert heard() == {(DISPATCH_CHANNEL, "")}
        runtime.run_ticket(ticket_id=ran.id)  # the fast path: its two statements
        # One from the start's commit, one from the finish's.
        assert heard_list().count((waits.TICKET_CHANNEL, str(ran.id))) == 2
        assert Ticket.objects.get(id=ran.id).state == TicketState.SUCCEEDED
        cancelled = admit_ticket(endpoint="live.b", input={}).ticket
        heard()
        runtime_services.cancel_ticket(ticket_id=cancelled.id, actor="test", reason="heard")
        assert heard() == {(waits.TICKET_CHANNEL, str(cancelled.id))}


def test_a_strangers_ticket_is_404_and_no_session_is_401(olive, django_user_model):
    ticket = admit_ticket(endpoint="live.a", input={}).ticket
    mallory = django_user_model.objects.create_user("mallory", password="pw-mallory-1")
    assert logged_in(mallory).get(URL, {"ticket": str(ticket.id)}).status_code == 404
    assert logged_in(olive).get(URL, {"ticket": "not-a-uuid"}).status_code == 404
    anonymous = Client().get(URL, {"ticket": str(ticket.id)})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == "unauthenticated"
    assert logged_in(olive).post(URL, {"token": "1"}).status_code == 405


def test_a_process_holds_no_more_watches_than_its_slots(olive, settings):
    settings.CONSOLE_LIVE_SLOTS = 1
    token = ticket_selectors.ledger_change_token()
    first = Watch(olive, token=token)
    wait_until_waiting(waits.ANY)
    second = logged_in(olive).get(URL, {"token": token}).json()
    assert second == {"live": False, "retry_s": 30}  # the page polls meanwhile
    admit_ticket(endpoint="live.a", input={})
    assert first.result(timeout=10).json()["changed"] is True
    third = Watch(olive, token=ticket_selectors.ledger_change_token())
    wait_until_waiting(waits.ANY)  # the slot came back
    admit_ticket(endpoint="live.b", input={})
    assert third.result(timeout=10).json()["changed"] is True
