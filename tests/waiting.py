"""The suite's one wait: poll a signal until it holds, fail at a deadline.

Free of Django and pytest, so the helpers bench/ borrows (tests/nginx.py,
tests/faults/cluster.py) use it too; tests import it as
``tests.conftest.wait_for``."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
):
    """Poll ``predicate`` until it returns something truthy and return that;
    raise AssertionError at the deadline. A predicate may raise to fail at
    once (a process that died while we wait for it to listen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(interval)  # the poll interval of the one wait helper, not a wait on its own
