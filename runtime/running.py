"""Which runner runs a turn, and where: above the runner kinds
(``runners``), the slot's warm process (``isolation``) and the agent
adapters (``agents.runner``), all of which import ``runners`` for the turn's
types; the runtime calls ``run``."""

from __future__ import annotations

import logging

from endpoints import runner_spec

from . import runners
from .agents.runner import preload, run_agent
from .isolation import run_isolated
from .runners import Outcome, RunnerError, TurnContext

log = logging.getLogger("runtime.runners")


def run(ctx: TurnContext) -> Outcome:
    """Run the turn's runner as its kind says: a python callable inline or in
    the slot's warm process, an agent in that process, a command, an http
    agent. A runner that no longer fits its schema or the allow-list is
    refused; the outcome never carries the turn's token, nor anything the
    ledger cannot store (``runners.storable``: ``unstorable_result``). A
    failure of the worker's own code before the runner starts or after it
    returned fails the turn ``runtime_error``."""
    kind = ctx.runner.get("kind")
    try:
        # A runner stored before its kind's schema (an unknown field, a
        # literal credential) is not run: fixing it is an owner's change
        # (check_runners lists them), and running it would send what the
        # schema refuses.
        invalid = runner_spec.problem(ctx.runner)
        # Again before every turn: an endpoint configured before the operator
        # narrowed the allow-list must not keep running what is now refused.
        refused = None if invalid else runner_spec.not_allowed(ctx.runner)
    except Exception as exc:  # nothing runs yet: the turn fails, the endpoint serves on
        log.exception("turn %s: checking its runner failed", ctx.turn_id)
        return runners.runtime_error(exc, "checking the runner")
    if invalid:
        log.warning("turn %s refused: its runner does not fit the schema: %s", ctx.turn_id, invalid)
        return Outcome.failure({"code": "runner_invalid", "detail": invalid})
    if refused:
        log.warning("turn %s refused: %s", ctx.turn_id, refused)
        return Outcome.failure({"code": "runner_not_allowed", "detail": refused})
    try:
        if kind == "python" and runners.isolation(ctx.runner) == runners.PROCESS:
            outcome = run_isolated(
                ctx,
                runners._run_python,
                kill_after_s=runners.kill_after_s(ctx.runner, ctx.interrupt_grace_s),
            )
        elif kind == "python":
            outcome = runners._run_python(ctx)
        elif kind == "agent":
            preload(ctx.runner)

            outcome = run_isolated(
                ctx, run_agent, kill_after_s=runners.kill_after_s(ctx.runner, ctx.interrupt_grace_s)
            )
        elif kind == "command":
            outcome = runners._run_command(ctx)
        elif kind == "http":
            outcome = runners._run_http(ctx)
        else:
            raise RunnerError(f"unknown runner kind {kind!r}")
    except RunnerError as exc:
        outcome = Outcome.failure({"code": "runner_error", "detail": str(exc)})
    # The runner returned: whatever it returned, the turn ends in an outcome
    # the ledger can store (an isolated turn's process checked it before
    # sending it; an inline one's is checked here).
    try:
        return runners.redact_token(runners.storable(outcome), ctx.token)
    except Exception as exc:
        log.exception("turn %s: its outcome could not be checked", ctx.turn_id)
        return runners.runtime_error(exc, "checking the runner's outcome")
