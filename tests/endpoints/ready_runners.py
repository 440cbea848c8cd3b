"""The demo runners, announcing that their callable has begun: each writes
the file named in ``input.ready_file`` once it runs (after it has set SIGTERM
aside, for the stubborn one), then does the demo's work. A test waits for the
file instead of guessing how long a child takes to start. Allowed by the
tests' runner allow-list (``tests.``)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from runtime import demo
from runtime.runners import TurnContext


def _ready(ctx: TurnContext) -> None:
    Path(ctx.input["ready_file"]).write_text("ready")


def sleep(ctx: TurnContext) -> dict[str, Any]:
    _ready(ctx)
    return demo.sleep(ctx)


def stubborn(ctx: TurnContext) -> dict[str, Any]:
    if ctx.input.get("ignore_sigterm", True):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before the signal of readiness
    _ready(ctx)
    return demo.stubborn(ctx)
