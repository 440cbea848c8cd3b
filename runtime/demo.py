"""The demo endpoints' runners (``seed_demo``): small, honest examples of
each behaviour the runtime has to handle."""

from __future__ import annotations

import time
from typing import Any

from .runners import Child, Resume, TurnContext, Wait


def echo(ctx: TurnContext) -> dict[str, Any]:
    return {"echo": ctx.input}


def _seconds(ctx: TurnContext, default: float = 1.0) -> float:
    try:
        return max(0.0, float(ctx.input.get("seconds", default)))
    except (TypeError, ValueError):
        raise ValueError("input.seconds must be a number") from None


def sleep(ctx: TurnContext) -> dict[str, Any]:
    """Sleeps ``input.seconds`` and honours interrupts (returns early)."""
    seconds = _seconds(ctx)
    started = time.monotonic()
    interrupted = ctx.wait_interrupted(seconds)
    return {"slept_s": round(time.monotonic() - started, 3), "interrupted": interrupted}


def stuck(ctx: TurnContext) -> dict[str, Any]:
    """Sleeps ``input.seconds`` and ignores interrupts: shows quarantine."""
    seconds = _seconds(ctx, 600.0)
    time.sleep(seconds)
    return {"slept_s": seconds}


def stubborn(ctx: TurnContext) -> dict[str, Any]:
    """Sleeps ``input.seconds`` and ignores interrupts, and SIGTERM too
    (``input.ignore_sigterm``, default true): run process-isolated, the
    escalation stops it with SIGKILL and the exit status is the evidence."""
    import signal

    seconds = _seconds(ctx, 600.0)
    if ctx.input.get("ignore_sigterm", True):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return {"slept_s": seconds}


def fail(ctx: TurnContext) -> dict[str, Any]:
    raise RuntimeError(ctx.input.get("message", "demo.fail always fails"))


def research(ctx: TurnContext) -> Wait | Resume:
    """A root ticket dispatches ``input.children`` children (to
    ``input.child_endpoint``, default ``demo.echo``, each with
    ``input.child_input`` merged into its input) and waits; each callback's
    turn checks the children and completes the parent with their results once
    all are done (the last callback does it). A child that was re-run shows
    its re-run's state and result (``children_of``)."""
    callback = ctx.input.get("callback")
    if callback is None:
        try:
            n = int(ctx.input.get("children", 2))
        except (TypeError, ValueError):
            raise ValueError("input.children must be an integer") from None
        if not 0 < n <= 50:
            raise ValueError("input.children must be between 1 and 50")
        topic = ctx.input.get("topic", "demo")
        target = ctx.input.get("child_endpoint", "demo.echo")
        extra = ctx.input.get("child_input") or {}
        if not isinstance(target, str) or not isinstance(extra, dict):
            raise ValueError("input.child_endpoint must be a string, input.child_input an object")
        return Wait(
            children=[
                Child(endpoint=target, input={**extra, "topic": topic, "part": i}) for i in range(n)
            ],
            continuation={"ticket": str(ctx.ticket_id), "step": "gather"},
        )
    parent = (callback.get("continuation") or {}).get("ticket")
    children = ctx.children_of(parent)
    done = [c for c in children if c["state"] in ("succeeded", "failed", "cancelled", "orphaned")]
    if len(done) < len(children):
        return Resume(
            ticket=parent, keep_waiting=True, own_result={"waiting": len(children) - len(done)}
        )
    return Resume(
        ticket=parent,
        result={
            "children": [
                {"id": c["id"], "state": c["state"], "result": c["result"]} for c in children
            ]
        },
        own_result={"completed": parent},
    )


def agent():
    """``demo.agent``: a Pydantic AI agent on a deterministic offline model
    (``FunctionModel``: no network, no key). Its input is ``{"prompt": ...}``:

    - ``remember <text>``: answers ``noted: <text>``; ``recall``: lists every
      ``remember`` of earlier tickets (each cut to 60 characters; the
      endpoint's history is its memory);
    - ``delegate <a>, <b>, ...``: one ``delegate`` call per item to
      ``demo.echo`` in one model response; when the children's callbacks
      resume it: ``children said: ...`` (a failed child is reported as failed;
      ``delegate fail`` asks ``demo.fail``; ``delegate-slow <a>, ...`` asks
      ``demo.sleep`` for 2 s each);
    - ``send <to>``: calls ``send_report``, which requires an owner's approval
      and declares a side effect (it gets an idempotency key);
    - ``slow <seconds>``: awaits the ``slow`` tool (shows interrupts);
    - anything else: ``echo: <prompt>``.
    """
    from .agents import demo_agent

    return demo_agent.build()
