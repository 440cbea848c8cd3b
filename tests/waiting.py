"""The suite's one wait: poll a signal until it holds, fail at a deadline.

Free of Django and pytest, so the helpers bench/ borrows (tests/nginx.py,
tests/faults/cluster.py) use it too; tests import it as
``tests.conftest.wait_for``."""

from __future__ import annotations

import time
from collections.abc import Callable

# Without an ``interval`` the polls start quick and slow down to the
# longest: a signal that comes at once is seen at once, and a wait that lasts
# (a process starting on a loaded machine) asks less often. Many predicates
# are a request or a query, and a suite bound by CPU pays for every poll.
FIRST_INTERVAL_S = 0.01
LONGEST_INTERVAL_S = 0.1


def wait_for(
    predicate: Callable[[], object],
    *,
    timeout: float = 20.0,
    interval: float | None = None,
    message: str = "condition",
):
    """Poll ``predicate`` until it returns something truthy and return that;
    raise AssertionError at the deadline. A predicate may raise to fail at
    once (a process that died while we wait for it to listen). ``interval``:
    a fixed poll interval instead of the growing one."""
    deadline = time.monotonic() + timeout
    step = interval or FIRST_INTERVAL_S
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(step)  # the poll interval of the one wait helper, not a wait on its own
        if interval is None:
            step = min(step * 1.5, LONGEST_INTERVAL_S)
