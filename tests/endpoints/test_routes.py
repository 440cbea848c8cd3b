"""Routes that move: moving an alias to another endpoint is a route
generation; a dedupe key admitted through the alias before the move keeps
its identity after it (a retry finds the original ticket, wherever it
ran), and tickets admitted before the move finish where they were
admitted."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from core.errors import DedupeConflict
from endpoints import services
from endpoints.models import EndpointAlias, RouteGeneration
from runtime.turns.execute import run_ticket
from tests.waiting import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

ECHO = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}


def _pair():
    old = services.create_endpoint(address="svc.v1", runner=ECHO, aliases=["svc"], actor="t")
    new = services.create_endpoint(address="svc.v2", runner=ECHO, actor="t")
    return old, new


def _admit(address: str, key: str, n: int = 1):
    return admit_ticket(endpoint=address, input={"n": n}, dedupe_key=key, actor="test")


def test_a_moved_alias_keeps_dedupe_identity_for_keys_admitted_before_the_move(db):
    old, new = _pair()
    before = _admit("svc", "k-1")
    assert before.ticket.endpoint_id == old.id
    route = services.move_alias(alias="svc", to_address="svc.v2", reason="v2 is live", actor="t")
    assert (route.number, route.endpoint_id) == (2, new.id)
    assert EndpointAlias.objects.get(alias="svc").endpoint_id == new.id
    # The retry through the old address finds the original ticket, on v1.
    retry = _admit("svc", "k-1")
    assert retry.duplicate and retry.ticket.id == before.ticket.id
    assert retry.ticket.endpoint.address == "svc.v1"
    with pytest.raises(DedupeConflict):
        _admit("svc", "k-1", n=2)
    assert Ticket.objects.filter(dedupe_key="k-1").count() == 1
    # A new key goes to v2, and its retry finds it there.
    fresh = _admit("svc", "k-2")
    assert fresh.ticket.endpoint_id == new.id
    assert _admit("svc", "k-2").ticket.id == fresh.ticket.id
    # The ticket admitted before the move finishes where it was admitted.
    run_ticket(ticket_id=before.ticket.id)
    done = Ticket.objects.select_related("turn").get(id=before.ticket.id)
    assert (done.state, done.endpoint_id, done.turn.endpoint_id) == ("succeeded", old.id, old.id)
    assert list(
        RouteGeneration.objects.filter(alias="svc").values_list("number", "endpoint_id")
    ) == [(1, old.id), (2, new.id)]


def test_an_alias_removed_and_added_elsewhere_keeps_identity_too(db):
    old, new = _pair()
    before = _admit("svc", "k-1")
    services.update_endpoint(address="svc.v1", changes={"aliases": []}, actor="t")
    services.update_endpoint(address="svc.v2", changes={"aliases": ["svc"]}, actor="t")
    assert list(
        RouteGeneration.objects.filter(alias="svc").values_list("number", "endpoint_id")
    ) == [(1, old.id), (2, None), (3, new.id)]
    assert _admit("svc", "k-1").ticket.id == before.ticket.id


@pytest.mark.django_db(transaction=True)
def test_admissions_racing_a_move_make_one_ticket_per_key():
    _pair()
    barrier = threading.Barrier(9)
    errors: list[Exception] = []

    def admit(i: int) -> None:
        try:
            barrier.wait()
            _admit("svc", "race")
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)
        finally:
            connection.close()

    def move() -> None:
        try:
            barrier.wait()
            services.move_alias(alias="svc", to_address="svc.v2", reason="race", actor="t")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=move))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert Ticket.objects.filter(dedupe_key="race").count() == 1
    assert _admit("svc", "race").duplicate


@pytest.mark.django_db(transaction=True)
def test_an_admission_that_waited_for_a_move_finds_the_key_admitted_before_it():
    """The race test's rare loser, made certain: the move has updated the
    alias and holds it; an admission of a key admitted before the move
    waits for the alias, and once the move commits it must find the ticket
    on the old endpoint, not admit a second one on the new."""
    old, _ = _pair()
    before = _admit("svc", "held")
    moved, release = threading.Event(), threading.Event()
    errors: list[Exception] = []
    answers: list = []

    def move() -> None:
        with transaction.atomic():
            services.move_alias(alias="svc", to_address="svc.v2", reason="held", actor="t")
            moved.set()
            release.wait(30)

    mover = _started(move, errors)
    assert moved.wait(30), errors
    admitter = _started(lambda: answers.append(_admit("svc", "held")), errors)
    wait_for(
        lambda: _waiting_on_a_lock("claimcheck_admit"),
        timeout=20,
        message="the admission to wait for the alias the move holds",
    )
    release.set()
    mover.join(30)
    admitter.join(30)
    assert not errors, errors
    assert [(a.duplicate, a.ticket.id, a.ticket.endpoint_id) for a in answers] == [
        (True, before.ticket.id, old.id)
    ]
    assert Ticket.objects.filter(dedupe_key="held").count() == 1


def _started(fn, errors: list[Exception]) -> threading.Thread:
    """``fn`` in a thread of its own, started; what it raises goes to
    ``errors`` (asserted by the test), its connection closed at the end."""

    def run() -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - collected, asserted by the caller
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _waiting_on_a_lock(query: str) -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            [f"%{query}%"],
        )
        return cur.fetchone()[0] > 0
