"""The dispatcher's passes are at least ``DISPATCHER_MIN_GAP_S`` apart: a
burst of admissions (each one notifies) is served by one pass per gap, and
the first admission after a quiet spell at once. A real dispatcher thread
(real LISTEN) against PostgreSQL; the broker's publish is recorded instead."""

from __future__ import annotations

import threading
import time
from unittest import mock

import pytest

from runtime.dispatcher import Dispatcher
from tests.conftest import wait_for
from tickets.admission import admit_ticket

pytestmark = pytest.mark.django_db(transaction=True)

GAP = 1.0


def test_a_burst_is_one_pass_per_gap_and_a_quiet_spell_is_served_at_once(make_endpoint, settings):
    settings.DISPATCHER_MIN_GAP_S = GAP
    settings.DISPATCHER_POLL_S = 600.0  # only notifications wake it
    for name in "abcd":
        make_endpoint(f"gap-{name}")
    published: dict[str, int] = {}
    lock = threading.Lock()

    def send_task(name, args=None, **kw):
        with lock:
            published[args[0]] = dispatcher.rounds

    dispatcher = Dispatcher(name="gap")
    with mock.patch("config.celery.app.send_task", side_effect=send_task):
        dispatcher.start()
        try:
            assert dispatcher.listening.wait(20), "the dispatcher to LISTEN"
            wait_for(lambda: dispatcher.rounds >= 1, message="its first pass")

            a = str(admit_ticket(endpoint="gap-a", input={}).ticket.id)
            wait_for(lambda: a in published, message="a published")
            first = dispatcher.last_began
            # Two admissions within the gap: two notifications, one pass.
            b = str(admit_ticket(endpoint="gap-b", input={}).ticket.id)
            c = str(admit_ticket(endpoint="gap-c", input={}).ticket.id)
            wait_for(lambda: b in published and c in published, timeout=30, message="b and c")
            assert published[b] == published[c] == published[a] + 1
            assert dispatcher.last_began - first >= GAP

            # A quiet spell longer than the gap: the next admission is served
            # without waiting one out.
            wait_for(lambda: time.monotonic() - dispatcher.last_began > GAP, message="quiet")
            admitted = time.monotonic()
            d = str(admit_ticket(endpoint="gap-d", input={}).ticket.id)
            wait_for(lambda: d in published, message="d published")
            assert dispatcher.last_began - admitted < GAP / 2
        finally:
            dispatcher.stop()
            dispatcher.join(timeout=10)
