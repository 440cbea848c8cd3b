"""Every worker runs without gossip and mingle, whatever its command line
says (config/celery.py): a Redis restart made gossip's consumer restart
take a worker down (celery/kombu#582). And a channel closed on a released
connection with a message unacknowledged, kombu's same fault by another
path, does not take it down either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _test_env

pytestmark = pytest.mark.integration  # it starts a Python process

# Built, not started, in a process of its own: building a worker sends
# worker_init, whose receivers change the process's settings (the database
# pool) and Celery's loader state, which the test process must keep.
PROBE = """
import json
import django
django.setup()
from config.celery import app
worker = app.WorkController(pool_cls="solo", concurrency=1, hostname="probe@test")
steps = {type(s).__name__: bool(s.enabled) for s in worker.consumer.blueprint.steps.values()
         if getattr(s, "enabled", None) is not None}
print(json.dumps({"options": worker.options, "steps": steps}))
"""


def _probe(code: str) -> dict:
    """Run ``code`` in a Python process of its own; its last line, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**_test_env(), "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_worker_started_without_the_flags_has_no_gossip_and_no_mingle():
    built = _probe(PROBE)
    assert built["options"]["without_gossip"] is True
    assert built["options"]["without_mingle"] is True
    assert built["steps"]["Gossip"] is False
    assert built["steps"]["Mingle"] is False
    # What the worker does need is still there.
    assert built["steps"]["Tasks"] and built["steps"]["Control"]


# A channel closed after its connection was released, with a message still
# unacknowledged: what a consumer does when Redis goes away mid-message.
RELEASED = """
import json
import django
django.setup()
from kombu import Connection
from config.celery import app
app.WorkController(pool_cls="solo", concurrency=1, hostname="probe@test")  # worker_init
connection = Connection(app.conf.broker_url)
channel = connection.channel()
channel.qos._delivered["unacked"] = None  # a delivery not acknowledged yet
channel._pool = None  # the pool dropped with the broken connection
connection.transport.client = None  # released
try:
    connection.maybe_close_channel(channel)
    outcome = "closed"
except Exception as exc:
    outcome = type(exc).__name__
print(json.dumps({"outcome": outcome, "closed": channel.closed}))
"""


def test_a_channel_closed_after_its_connection_was_released_does_not_take_the_worker_down():
    # Without config/celery.py's receiver: AttributeError, "Unrecoverable
    # error", and the worker exits.
    assert _probe(RELEASED) == {"outcome": "closed", "closed": True}
