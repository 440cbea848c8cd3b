"""Runners for the fault tests. Each execution appends one line to
``FAULTS_COUNTER_FILE`` before it does anything else, so a replay (a second
execution of one ticket's work) shows as a second line for that ticket even
when the worker running it is killed a moment later."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from runtime.runners import TurnContext


def _count(ctx: TurnContext) -> None:
    line = json.dumps(
        {"ticket": str(ctx.ticket_id), "turn": str(ctx.turn_id), "seq": ctx.seq, "pid": os.getpid()}
    )
    # One write of one short line with O_APPEND: atomic between processes.
    fd = os.open(os.environ["FAULTS_COUNTER_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def counted(ctx: TurnContext) -> dict[str, Any]:
    """Counts its execution, then works ``input.seconds`` (default 0.2). It
    honours an interrupt (returns early) unless ``input.ignore_interrupts``."""
    _count(ctx)
    seconds = float(ctx.input.get("seconds", 0.2))
    if ctx.input.get("ignore_interrupts"):
        time.sleep(seconds)  # the behaviour under test: a turn's own work, deaf to interrupts
        return {"worked_s": seconds, "interrupted": False}
    interrupted = ctx.wait_interrupted(seconds)
    return {"worked_s": seconds, "interrupted": interrupted}


def returned_file(counter_file: str | None = None) -> str:
    """Where ``timed`` writes when each run returned (beside the counter file)."""
    return (counter_file or os.environ["FAULTS_COUNTER_FILE"]) + ".returned"


def timed(ctx: TurnContext) -> dict[str, Any]:
    """``counted``, then one line with the wall-clock instant it returns:
    the fault test compares it with the interrupt the ledger recorded (one
    host, one clock)."""
    result = counted(ctx)
    line = json.dumps({"ticket": str(ctx.ticket_id), "returned_at": time.time()})
    fd = os.open(returned_file(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    return result
