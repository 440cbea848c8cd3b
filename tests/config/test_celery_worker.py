"""Every worker runs without gossip and mingle, whatever its command line
says (config/celery.py): a Redis restart made gossip's consumer restart
take a worker down (celery/kombu#582)."""

from __future__ import annotations

from config.celery import app


def test_a_worker_started_without_the_flags_has_no_gossip_and_no_mingle():
    # Built, not started: the bootsteps exist with their ``enabled`` decided.
    worker = app.WorkController(pool_cls="solo", concurrency=1, hostname="probe@test")
    steps = {type(step).__name__: step for step in worker.consumer.blueprint.steps.values()}
    assert worker.options["without_gossip"] is True
    assert worker.options["without_mingle"] is True
    assert steps["Gossip"].enabled is False
    assert steps["Mingle"].enabled is False
    # What the worker does need is still there.
    assert steps["Tasks"].enabled and steps["Control"].enabled
