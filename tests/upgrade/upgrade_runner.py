"""The rolling-upgrade test's runner (tests/test_rolling_upgrade.py).

A top-level module in a directory of its own, so both releases' processes
import it by one name (``upgrade_runner.work``) with their own tree first on
``sys.path``: the endpoints stored under the old release keep working under
the new one. It needs nothing from either tree but the ``TurnContext`` both
pass in.
"""

from __future__ import annotations

import os
import time
from typing import Any


def work(ctx) -> dict[str, Any]:
    """Works ``input.seconds`` (default 0.1), or, given ``input.gate`` (a
    path), until that file exists (at most ``input.max_s``, default 240):
    the test holds a turn open across the upgrade this way. Answers which
    release's process ran it (``UPGRADE_RELEASE``) and its pid."""
    gate = ctx.input.get("gate")
    if gate:
        deadline = time.monotonic() + float(ctx.input.get("max_s", 240))
        while not os.path.exists(gate) and time.monotonic() < deadline:
            if ctx.wait_interrupted(0.05):
                break
    else:
        ctx.wait_interrupted(float(ctx.input.get("seconds", 0.1)))
    return {
        "release": os.environ.get("UPGRADE_RELEASE", ""),
        "pid": os.getpid(),
        "gate_open": bool(gate) and os.path.exists(gate),
    }
