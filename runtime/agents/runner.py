"""The ``agent`` runner: one turn of a framework agent, in the turn's own
process (``runtime/isolation.py``; this module runs in the forked child,
which has no database: it asks the supervisor for children, ticket states
and to write receipts).

A turn is one of:

1. **A new exchange** (any input but a callback or an approval): the
   conversation so far (``memory.conversation``), then the agent runs on
   ``input.prompt`` (or the input as JSON). It ends with a final output
   (the ticket succeeds), or with pending calls: ``delegate`` calls become
   child tickets with ``return_to`` this endpoint, calls of tools that
   require approval wait for an owner; the ticket goes ``waiting`` and the
   lock is released.
2. **A resume** (the callback of a child, or an owner's approval ticket):
   when the waiting ticket is still waiting and every call of its current
   round has its answer (children terminal, approvals decided), the agent
   runs again on the exchange with the answers as tool results. Done: the
   waiting ticket is completed with its output by this exact turn. More
   pending calls: a new round (at most ``AGENT_MAX_ROUNDS`` per exchange),
   whose children and approvals belong to the waiting ticket, which stays
   waiting; this turn's own ticket succeeds. Otherwise the turn records
   what it still waits for and changes nothing.

The messages of each turn are stored as an artifact (``memory.store``)
whose pointer the finish writes into the ContextEntry.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from typing import Any

from django.conf import settings

from core import secrets
from core.canonical import canonical_json

from ..runners import Child, Outcome, Resume, RunnerError, TurnContext, Wait
from . import ADAPTERS, _in_doubt, _turn_id, derive_key, memory
from .protocol import Adapter, AgentStep, AgentTurn, Answer, ToolHooks, cancellable, digest

log = logging.getLogger(__name__)

# At most this many delegations in one turn; more fails the turn.
MAX_DELEGATIONS = 20
# Tool arguments and results up to this size are kept in the receipt itself;
# larger ones become an artifact the receipt points to.
RECEIPT_INLINE_BYTES = 512
# Pending approvals keep arguments up to this size in the continuation
# (what the console and API show); larger ones keep the digest only.
APPROVAL_ARGS_BYTES = 2048
CHILD_TERMINAL = ("succeeded", "failed", "cancelled", "orphaned")


def approval_key(exchange: str, call_id: str, round_: int = 1) -> str:
    """The dedupe key of an owner's approval ticket for one call (the round
    in it from the second on: a call id a model repeats in a later round
    is another call)."""
    marker = "" if round_ <= 1 else f"r{round_}:"
    return f"approval:{exchange}:{marker}{_short(call_id)}"


def delegation_key(exchange: str, call_id: str, round_: int = 1) -> str:
    marker = "" if round_ <= 1 else f"r{round_}/"
    return f"{exchange}/{marker}call/{_short(call_id)}"


def max_rounds(runner: dict[str, Any]) -> int:
    """Rounds of pending calls one exchange may have: ``AGENT_MAX_ROUNDS``,
    or the runner's lower ``max_rounds``."""
    cap = settings.AGENT_MAX_ROUNDS
    own = runner.get("max_rounds")
    if isinstance(own, int) and not isinstance(own, bool) and own >= 1:
        cap = min(cap, own)
    return max(cap, 1)


def _short(call_id: str) -> str:
    return call_id if len(call_id) <= 120 else digest(call_id)


def load_adapter(framework: str) -> Adapter:
    module = ADAPTERS.get(framework)
    if module is None:
        raise RunnerError(f"unknown agent framework {framework!r}")
    try:
        return importlib.import_module(module).ADAPTER
    except ImportError as exc:
        raise RunnerError(
            f"agent framework {framework!r} is not installed on this worker: {exc}"
        ) from exc


def load_agent(path: str, adapter: Adapter) -> Any:
    """The object at ``path``: the agent itself, or a factory called with no
    arguments that returns one."""
    module, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RunnerError(f"cannot load agent {path!r}: {exc}") from exc
    try:
        adapter.check(obj)
        return obj
    except TypeError:
        if not callable(obj):
            raise RunnerError(f"{path!r} is not a {adapter.framework} agent") from None
    agent = obj()
    try:
        adapter.check(agent)
    except TypeError as exc:
        raise RunnerError(f"{path!r} returned no {adapter.framework} agent: {exc}") from None
    return agent


def preload(runner: dict[str, Any]) -> None:
    """Import the framework and the agent's module in the supervising worker,
    before the fork: each turn's process then starts with them loaded
    instead of importing the framework again (seconds per turn). A failure
    here is left for the turn's process to report."""
    try:
        adapter = load_adapter(runner.get("framework", ""))
        module = str(runner.get("path") or "").rpartition(".")[0]
        if module:
            importlib.import_module(module)
        warm = getattr(adapter, "warm", None)
        if warm is not None:
            warm()
    except Exception:  # noqa: BLE001 - reported by the turn itself
        log.warning("agent framework %s not preloaded", runner.get("framework"), exc_info=True)


def _export_secrets(runner: dict[str, Any]) -> None:
    """Model credentials by name: ``secrets: {ENV_VAR: SECRET_NAME}`` puts
    the named secret (core/secrets.py) into this turn's process
    environment, where the framework's provider looks for it. The value
    never reaches the runner dict, the ledger or a log."""
    for env_name, secret_name in (runner.get("secrets") or {}).items():
        os.environ[env_name] = secrets.secret(secret_name)


def run_agent(ctx: TurnContext) -> Outcome:
    try:
        _export_secrets(ctx.runner)
        adapter = load_adapter(ctx.runner["framework"])
        agent = load_agent(ctx.runner["path"], adapter)
    except secrets.SecretMissing as exc:
        return Outcome.failure({"code": "secret_missing", "detail": exc.detail})
    except RunnerError as exc:
        return Outcome.failure({"code": "runner_error", "detail": str(exc)})
    try:
        return _run(ctx, adapter, agent)
    except memory.MemoryError_ as exc:
        # The conversation cannot be rebuilt (an artifact lost or altered):
        # say so, never run the agent on a conversation with holes in it.
        error = {"code": "agent_memory", "detail": str(exc)}
        resume = _continuation(ctx.input)
        return _resume_outcome(resume[0], error=error) if resume else Outcome.failure(error)


def _run(ctx: TurnContext, adapter: Adapter, agent: Any) -> Outcome:
    resume = _continuation(ctx.input)
    if resume is None:
        earlier, _, _ = memory.conversation(
            ctx.history, resuming=None, runner=ctx.runner, submitter=ctx.submitter
        )
        turn = AgentTurn(
            prompt=_prompt(ctx.input),
            history=earlier,
            resumed=None,
            state=None,
            answers={},
            hooks=_hooks(ctx),
            input=ctx.input,
            options=ctx.runner,
            notes=ctx.notes,
        )
        return _run_and_conclude(ctx, adapter, agent, turn, exchange=str(ctx.ticket_id))
    exchange, _ = resume
    state = ctx.ticket_state(exchange)
    if state != "waiting":
        # Completed by an earlier turn (both children were done when the first
        # callback ran), cancelled, or not ours: nothing to resume.
        return Outcome.success({"resumed": None, "exchange": exchange, "exchange_state": state})
    # The round the exchange waits on now, as its last wait recorded it: a
    # callback of an earlier round (its call answered, the agent gone on to
    # another round since) resumes nothing by itself.
    current = ctx.continuation(exchange)
    if current is None:
        # Waiting, and what on cannot be read (the supervisor could not ask
        # the database): resume nothing rather than answer a round twice.
        own = {"waiting_for": None, "detail": "the exchange's continuation could not be read"}
        return Outcome(
            "success", result=own, resume=Resume(ticket=exchange, keep_waiting=True, own_result=own)
        )
    round_, pending = _round(current), current.get("pending") or {}
    answers, missing = _answers(ctx, exchange, pending, round_)
    if missing:
        own = {"waiting_for": missing, "round": round_}
        return Outcome(
            "success", result=own, resume=Resume(ticket=exchange, keep_waiting=True, own_result=own)
        )
    earlier, resumed, saved = memory.conversation(ctx.history, resuming=exchange, runner=ctx.runner)
    turn = AgentTurn(
        prompt=None,
        history=earlier,
        resumed=resumed,
        state=saved,
        answers=answers,
        hooks=_hooks(ctx),
        input=ctx.input,
        options=ctx.runner,
        notes=ctx.notes,
    )
    return _run_and_conclude(
        ctx, adapter, agent, turn, exchange=exchange, resuming=True, round_=round_
    )


def _round(agent_continuation: dict[str, Any]) -> int:
    value = agent_continuation.get("round")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _prompt(value: dict[str, Any]) -> str:
    prompt = value.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return canonical_json(value).decode()


def _continuation(value: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(the waiting exchange, the agent continuation it carries: ``{exchange,
    round, pending}``) for a callback or an approval ticket of an agent
    exchange; None for a new exchange."""
    carrier = value.get("callback") or value.get("approval")
    if not isinstance(carrier, dict):
        return None
    cont = carrier.get("continuation") or {}
    agent = cont.get("agent") if isinstance(cont, dict) else None
    if not isinstance(agent, dict) or not isinstance(agent.get("exchange"), str):
        return None
    return agent["exchange"], agent


def _answers(
    ctx: TurnContext, exchange: str, pending: dict[str, Any], round_: int
) -> tuple[dict[str, Answer], list[str]]:
    # Only tickets the runtime admitted answer a call: a user who may see the
    # waiting ticket could admit a child of it under the same dedupe key.
    children = {c.get("dedupe_key"): c for c in ctx.children_of(exchange) if c.get("runtime")}
    answers: dict[str, Answer] = {}
    missing: list[str] = []
    for call_id, call in pending.items():
        if call.get("kind") == "delegate":
            child = children.get(delegation_key(exchange, call_id, round_))
            if child is None or child["state"] not in CHILD_TERMINAL:
                missing.append(call_id)
            elif child["state"] == "succeeded":
                answers[call_id] = Answer("result", child["result"])
            else:
                # Failed, cancelled or orphaned: the agent is told, with no
                # invented result.
                answers[call_id] = Answer(
                    "error",
                    {"child": child["id"], "state": child["state"], "error": child.get("error")},
                )
        else:
            ticket = children.get(approval_key(exchange, call_id, round_))
            decision = ((ticket or {}).get("input") or {}).get("approval") or {}
            if "approved" not in decision:
                missing.append(call_id)
            else:
                answers[call_id] = Answer(
                    "approved" if decision["approved"] else "denied",
                    reason=str(decision.get("reason", "")),
                )
    return answers, missing


def _hooks(ctx: TurnContext) -> ToolHooks:
    def idempotency_key(call_id: str) -> str:
        return derive_key(str(ctx.turn_id), call_id)

    def _payload(prefix: str, value: Any) -> dict[str, Any]:
        body = canonical_json(value, default=str)
        out: dict[str, Any] = {f"{prefix}_sha256": digest(value), f"{prefix}_bytes": len(body)}
        if len(body) <= RECEIPT_INLINE_BYTES:
            out[prefix] = value if _plain(value) else body.decode()
        else:
            pointer = memory.store_blob(body)
            out[f"{prefix}_artifact"] = pointer["uri"]
        return out

    # The original's calls in doubt, each claimed by the first call of the
    # same tool here (the same arguments first).
    unclaimed = [dict(c) for c in ctx.keys_in_doubt if c.get("idempotency_key")]

    def claim(tool: str, args_sha256: str) -> str | None:
        same = [c for c in unclaimed if c.get("tool") == tool]
        match = next((c for c in same if c.get("args_sha256") == args_sha256), None)
        match = match or (same[0] if same else None)
        if match is None:
            return None
        unclaimed.remove(match)
        return match["idempotency_key"]

    def started(tool: str, call_id: str, args: Any, side_effect: bool) -> str | None:
        key = idempotency_key(call_id) if side_effect else None
        payload = _payload("args", args)
        event = {"kind": "tool_started", "tool": tool, "call_id": call_id, **payload}
        if side_effect:
            event.update(side_effect=True, idempotency_key=key)
            doubt = claim(tool, payload["args_sha256"])
            doubts = _in_doubt.get()
            if doubt is not None and doubts is not None:
                doubts[key] = doubt
                event["idempotency_key_in_doubt"] = doubt
        ctx.record(event)
        return key

    def ended(tool: str, call_id: str, status: str, duration_s: float, result: Any) -> None:
        event = {
            "kind": "tool_ended",
            "tool": tool,
            "call_id": call_id,
            "status": status,
            "duration_ms": round(duration_s * 1000, 1),
        }
        if result is not None:
            event.update(_payload("result", result))
        ctx.record(event)

    return ToolHooks(started=started, ended=ended, idempotency_key=idempotency_key)


def _plain(value: Any) -> bool:
    try:
        canonical_json(value)
    except (TypeError, ValueError):
        return False
    return True


def _run_and_conclude(
    ctx: TurnContext,
    adapter: Adapter,
    agent: Any,
    turn: AgentTurn,
    *,
    exchange: str,
    resuming: bool = False,
    round_: int = 0,
) -> Outcome:
    """Run the agent once. ``round_``: the round of pending calls the turn
    answers (0 for a new exchange)."""
    if ctx.interrupted():
        return Outcome.stopped("runner_returned", {"before_agent_run": True})
    seen: dict[str, float] = {}
    # Every task of the run copies this context: a tool finds its turn here.
    _turn_id.set(str(ctx.turn_id))
    _in_doubt.set({})
    try:
        step: AgentStep = asyncio.run(cancellable(adapter.run(agent, turn), ctx._interrupt, seen))
    except asyncio.CancelledError:
        # Stopped at its next await: how long after the flag reached this process.
        latency = time.monotonic() - seen["at"] if "at" in seen else None
        return Outcome.stopped(
            "runner_returned",
            {
                "cancelled": "asyncio",
                "cancel_latency_s": round(latency, 3) if latency is not None else None,
            },
        )
    except Exception as exc:  # the agent's failure is the ticket's failure
        log.info("agent %s raised %r", ctx.runner.get("path"), exc)
        failure = {"code": "agent_raised", "detail": f"{type(exc).__name__}: {exc}"}
        if resuming:
            return _resume_outcome(exchange, error=failure)
        return Outcome.failure(failure)
    if step.usage:
        ctx.record({"kind": "agent_usage", **step.usage})
    framework = adapter.framework
    if step.done:
        pointer = memory.store(
            framework=framework,
            exchange=exchange,
            status="done",
            messages=step.messages,
            state=None,
        )
        if resuming:
            return _resume_outcome(exchange, result=step.output, artifacts=[pointer])
        return Outcome.success(step.output, artifacts=[pointer])
    next_round = round_ + 1
    cap = max_rounds(ctx.runner)
    if next_round > cap:
        error = {
            "code": "agent_max_rounds",
            "detail": f"the agent asked for a round {next_round} of delegations or approvals "
            f"in one exchange; at most {cap} (AGENT_MAX_ROUNDS, the runner's max_rounds)",
        }
        return _resume_outcome(exchange, error=error) if resuming else Outcome.failure(error)
    try:
        children, pending = _pending(ctx, step, exchange=exchange, round_=next_round)
    except _BadStep as exc:
        error = exc.error
        return _resume_outcome(exchange, error=error) if resuming else Outcome.failure(error)
    pointer = memory.store(
        framework=framework,
        exchange=exchange,
        status="waiting",
        messages=step.messages,
        state=step.state,
    )
    continuation = {
        "ticket": exchange,
        "agent": {"exchange": exchange, "round": next_round, "pending": pending},
    }
    wait = Wait(children=children, continuation=continuation)
    if not resuming:
        return Outcome("wait", wait=wait, artifacts=[pointer])
    # Another round: the exchange's ticket stays waiting, now on these calls
    # (its children, its approvals); this turn's own ticket succeeds.
    own = {"resumed": exchange, "outcome": "waiting", "round": next_round}
    return Outcome(
        "success",
        result=own,
        artifacts=[pointer],
        resume=Resume(ticket=exchange, own_result=own, wait=wait),
    )


def _resume_outcome(
    exchange: str, *, result: Any = None, error: Any = None, artifacts: list | None = None
) -> Outcome:
    own = {"resumed": exchange, "outcome": "failed" if error is not None else "succeeded"}
    return Outcome(
        "success",
        result=own,
        artifacts=artifacts or [],
        resume=Resume(ticket=exchange, result=result, error=error, own_result=own),
    )


class _BadStep(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["detail"])
        self.error = error


def _pending(
    ctx: TurnContext, step: AgentStep, *, exchange: str, round_: int
) -> tuple[list[Child], dict[str, Any]]:
    """The step's pending calls: the children to admit, and the continuation's
    ``pending`` (call id -> what it waits for)."""
    allowed = ctx.runner.get("delegate_to")
    if len(step.delegations) > MAX_DELEGATIONS:
        raise _BadStep(
            {
                "code": "too_many_delegations",
                "detail": f"{len(step.delegations)} delegations in one turn; at most "
                f"{MAX_DELEGATIONS}",
            }
        )
    pending: dict[str, Any] = {}
    children: list[Child] = []
    for d in step.delegations:
        if not isinstance(d.endpoint, str) or not isinstance(d.input, dict):
            raise _BadStep(
                {"code": "bad_delegation", "detail": "delegate needs an endpoint and an object"}
            )
        if allowed is not None and d.endpoint not in allowed:
            raise _BadStep(
                {
                    "code": "delegation_not_allowed",
                    "detail": f"this agent may delegate to {', '.join(allowed) or 'nothing'}, "
                    f"not {d.endpoint!r}",
                }
            )
        pending[d.call_id] = {"kind": "delegate", "endpoint": d.endpoint}
        children.append(
            Child(
                endpoint=d.endpoint,
                input=d.input,
                dedupe_key=delegation_key(exchange, d.call_id, round_),
            )
        )
    for a in step.approvals:
        body = canonical_json(a.args, default=str)
        call: dict[str, Any] = {
            "kind": "approval",
            "tool": a.tool,
            "args_sha256": digest(a.args),
            "turn": str(ctx.turn_id),
        }
        if len(body) <= APPROVAL_ARGS_BYTES:
            call["args"] = a.args if _plain(a.args) else body.decode()
        pending[a.call_id] = call
    if not pending:
        # Nothing would ever answer it: the exchange would wait forever.
        raise _BadStep(
            {"code": "bad_delegation", "detail": "the agent's run ended waiting on no call"}
        )
    return children, pending
