"""Recovery fixtures: real quarantined cases, made by driving the turn
runtime in-process (admit, start, interrupt, let the grace run out,
quarantine). No state field is set by hand."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.apps import apps

from endpoints.models import Endpoint
from recovery.models import RecoveryCase
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn


@dataclass
class Quarantined:
    endpoint: Endpoint
    ticket: Ticket
    turn: Turn
    case: RecoveryCase

    def refresh(self) -> Quarantined:
        for obj in (self.endpoint, self.ticket, self.turn, self.case):
            obj.refresh_from_db()
        return self


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("owner")


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("mallory")


def drive_to_quarantine(ticket_id) -> Quarantined:
    """Start the endpoint's next turn (it must be this ticket's), ask it to
    stop, let the grace run out and quarantine it: the runtime's own steps."""
    started = runtime.start_turn(ticket_id=ticket_id)
    assert started is not None, "the turn should start"
    assert started.ticket.id == ticket_id, "the ticket should be the endpoint's oldest queued"
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id),
        timeout=10,
        message="the interrupt grace to run out and the turn to be quarantined",
    )
    return Quarantined(
        endpoint=Endpoint.objects.get(id=started.endpoint.id),
        ticket=Ticket.objects.get(id=ticket_id),
        turn=Turn.objects.get(id=started.turn.id),
        case=RecoveryCase.objects.get(id=case_id),
    )


@pytest.fixture
def stuck_endpoint(make_endpoint, owner):
    """An endpoint owned by ``owner`` whose runner ignores interrupts, with a
    tiny interrupt grace so tests reach quarantine quickly."""

    def make(address=None, **endpoint_kw) -> Endpoint:
        endpoint_kw.setdefault("interrupt_grace_s", 0.05)
        return make_endpoint(
            address, path="runtime.demo.stuck", owners=[owner.username], **endpoint_kw
        )

    return make


@pytest.fixture
def quarantine(stuck_endpoint):
    """``quarantine(...)`` -> a real open case on a new endpoint owned by ``owner``."""

    def make(address=None, input=None, dedupe_key=None, **endpoint_kw) -> Quarantined:  # noqa: A002
        endpoint = stuck_endpoint(address, **endpoint_kw)
        admitted = admit_ticket(
            endpoint=endpoint.address,
            input={"seconds": 30} if input is None else input,
            dedupe_key=dedupe_key,
            requester={"name": "tester", "metadata": {"run": 1}},
            actor="test",
        )
        return drive_to_quarantine(admitted.ticket.id)

    return make


@pytest.fixture
def owner_api(api, owner):
    from accounts.keys import create_api_key

    _, key = create_api_key(username=owner.username)
    return api.as_key(key)


@pytest.fixture
def outsider_api(api, outsider):
    from accounts.keys import create_api_key

    _, key = create_api_key(username=outsider.username)
    return api.as_key(key)


def dump_ledger(exclude: tuple[str, ...] = ("recovery_inspection",)) -> dict[str, list[dict]]:
    """Every row of every table of the ledger's apps, in primary-key order."""
    rows: dict[str, list[dict]] = {}
    for label in ("tickets", "endpoints", "runtime", "recovery"):
        for model in apps.get_app_config(label).get_models():
            table = model._meta.db_table
            if table in exclude:
                continue
            rows[table] = list(model.objects.order_by("pk").values())
    return rows
