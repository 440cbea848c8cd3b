"""Python runners for the warm turn process tests (allowed by the tests'
runner allow-list: ``tests.``): each says which process ran it and what it
found there."""

from __future__ import annotations

import os
import signal
import threading
import time


def where(ctx) -> dict:
    trace = ctx.envelope().get("trace") or {}
    return {
        "pid": os.getpid(),
        "leak": os.environ.get("CC_WARM_TEST_LEAK"),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "trace_id": trace.get("trace_id"),
        "beat": ctx.heartbeat() is False,
    }


def reads_history(ctx) -> dict:
    return {"echo": ctx.input, "history": len(ctx.history)}


def exports_a_secret(ctx) -> dict:
    os.environ["CC_WARM_TEST_LEAK"] = "a secret of this turn"
    return where(ctx)


def ignores_sigterm(ctx) -> dict:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return where(ctx)


def leaves_a_thread(ctx) -> dict:
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # the behaviour under test
    return where(ctx)


def naps(ctx) -> dict:
    """Honours its interrupt: returns as soon as the flag is up."""
    ctx.wait_interrupted(float(ctx.input.get("seconds", 30)))
    return where(ctx)


def exits(ctx) -> dict:
    os._exit(3)
