"""Threads released together against real PostgreSQL (a race test's start)."""

from __future__ import annotations

import threading

from django.db import connections


def race(*fns):
    """Run each of ``fns`` in its own thread, all released at once by a
    barrier; their results in order. Any exception fails the caller."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)
    errors: list[BaseException] = []

    def wrap(i, fn):
        def run():
            try:
                barrier.wait(timeout=10)
                results[i] = fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        return run

    threads = [threading.Thread(target=wrap(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return results
