"""Python runners (process-isolated) that record a tool call's start and
never its end: the turn's process dies, or ignores its interrupt until the
escalation kills it. In a re-run or retry they find the call in doubt in
``ctx.keys_in_doubt`` and return it."""

from __future__ import annotations

import os
import signal
import time


def _start(ctx, tool: str, side_effect: bool) -> None:
    receipt = {"kind": "tool_started", "tool": tool, "call_id": "call-1", "args_sha256": "0" * 64}
    if side_effect:
        receipt.update(side_effect=True, idempotency_key=f"key-of-{ctx.turn_id}")
    assert ctx.record(receipt)


def charges_and_dies(ctx) -> dict:
    if ctx.keys_in_doubt:
        return {"in_doubt": ctx.keys_in_doubt}
    _start(ctx, "charge", side_effect=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def looks_up_and_dies(ctx) -> dict:
    _start(ctx, "lookup", side_effect=False)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def charges_and_hangs(ctx) -> dict:
    if ctx.keys_in_doubt:
        return {"in_doubt": ctx.keys_in_doubt}
    _start(ctx, "charge", side_effect=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:  # deaf to its flag and to SIGTERM: only SIGKILL ends it
        time.sleep(0.05)
