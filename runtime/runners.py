"""Runners execute one turn: ``python`` (a callable), ``command`` (a
subprocess in its own process group, JSON in and out), ``http`` (an agent
service that answers at once or later through the turn API) and ``agent``
(a Pydantic AI or OpenAI Agents SDK agent through its adapter in
``runtime/agents/``, process-isolated like a python callable).

A runner gets a ``TurnContext`` and returns an ``Outcome``. Stop evidence is
runner-aware: only the runner that owns the work can say it ended (the python
callable returned; the command's process group was reaped by ``waitpid``; the
agent posted a stop receipt).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from django.conf import settings

from core import inputs, outbound, tracing
from core.canonical import canonical_json
from core.errors import Invalid
from core.secrets import SecretMissing
from endpoints import runner_spec
from endpoints.runner_spec import ISOLATIONS, KILL_AFTER_MAX_S

from . import runas

log = logging.getLogger(__name__)


# --- What a runner returns ----------------------------------------------------------


@dataclass
class Child:
    endpoint: str
    input: dict[str, Any]
    dedupe_key: str | None = None


@dataclass
class Wait:
    """End the turn and wait for these children; the lock is released. Each
    child carries ``continuation`` back in its callback."""

    children: list[Child]
    continuation: dict[str, Any] | None = None


@dataclass
class Resume:
    """From a callback's turn: complete the waiting ``ticket`` with ``result``
    (or ``error``), leave it waiting (``keep_waiting``), or have it wait on
    a new round of children (``wait``: admitted as the waiting ticket's own,
    their callbacks carry ``wait.continuation``). The callback ticket itself
    succeeds with ``own_result``."""

    ticket: str
    result: Any = None
    error: Any = None
    keep_waiting: bool = False
    own_result: Any = None
    wait: Wait | None = None


@dataclass
class Outcome:
    kind: str  # success | failure | wait | stopped | deferred | unproven
    result: Any = None
    error: Any = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    wait: Wait | None = None
    resume: Resume | None = None
    evidence: dict[str, Any] | None = None

    @classmethod
    def success(cls, result: Any, *, artifacts: list | None = None) -> Outcome:
        return cls("success", result=result, artifacts=artifacts or [])

    @classmethod
    def failure(cls, error: Any) -> Outcome:
        if not isinstance(error, dict):
            error = {"code": "runner_error", "detail": str(error)}
        return cls("failure", error=error)

    @classmethod
    def stopped(cls, kind: str, detail: dict[str, Any] | None = None) -> Outcome:
        return cls("stopped", evidence={"kind": kind, "detail": detail or {}})

    @classmethod
    def unproven(cls, detail: dict[str, Any]) -> Outcome:
        """The runner could not prove the turn stopped (an isolated process
        that survived SIGKILL, a worker shutting down with an inline turn
        still running): nothing is finished, the budget sweep quarantines."""
        return cls("unproven", evidence={"kind": "none", "detail": detail})

    @classmethod
    def deferred(cls) -> Outcome:
        """An http agent accepted the turn and will answer through the API."""
        return cls("deferred")


class RunnerError(Exception):
    """A runner could not produce an outcome; the message says why."""


# --- What the ledger can store --------------------------------------------------------


def _values(outcome: Outcome):
    """(field, value) of every part of ``outcome`` the ledger stores."""
    yield "result", outcome.result
    yield "error", outcome.error
    yield "artifacts", outcome.artifacts
    resume_wait = outcome.resume.wait if outcome.resume is not None else None
    for name, wait in (("wait", outcome.wait), ("resume.wait", resume_wait)):
        if wait is not None:
            yield f"{name}.continuation", wait.continuation
            for i, child in enumerate(wait.children):
                yield f"{name}.children.{i}.input", child.input
    if outcome.resume is not None:
        yield "resume.result", outcome.resume.result
        yield "resume.error", outcome.resume.error
        yield "resume.own_result", outcome.resume.own_result


def unstorable(outcome: Outcome) -> str | None:
    """What in a runner's outcome the ledger cannot store, in words that name
    the place and never the value, or None: text PostgreSQL refuses (a NUL,
    a lone surrogate), a number JSON cannot hold, a value that is not JSON,
    or nesting past ``TICKET_MAX_JSON_DEPTH`` (core/inputs.py: the bound every
    value that enters has, so the worker can always carry and finish it)."""
    if outcome.kind not in ("success", "failure", "wait"):
        return None  # the runtime's own: stop evidence, deferred, unproven
    depth = inputs.max_depth()
    try:
        for name, value in _values(outcome):
            inputs.check_value(value, path=name, depth=depth)
    except inputs.Unstorable as exc:
        return exc.detail
    if outcome.error is not None:
        # A result over its cap becomes an artifact; an error stays on the row.
        size = len(canonical_json(outcome.error, default=str))
        if size > settings.TICKET_MAX_RESULT_BYTES:
            return f"error is {size} bytes, over TICKET_MAX_RESULT_BYTES"
    return None


def storable(outcome: Outcome, source: str = "the runner") -> Outcome:
    """``outcome``, or when the ledger cannot store it the turn's failure
    ``unstorable_result`` saying what was wrong (never the value): a reply
    the ledger cannot store fails its ticket, never the finish."""
    problem = unstorable(outcome)
    if problem is None:
        return outcome
    log.warning("%s returned what the ledger cannot store: %s", source, problem)
    return storable_failure(f"from {source}: {problem}")


def storable_failure(detail: str) -> Outcome:
    return Outcome.failure({"code": "unstorable_result", "detail": detail[:2000]})


def runtime_error(exc: BaseException, doing: str) -> Outcome:
    """The turn's failure when the worker's own code failed while ``doing``
    (preparing the turn, handing it to its process, finishing it) and no
    runner is running: the exception's class, never its text (which may
    carry a value); the traceback is in the worker's log."""
    return Outcome.failure(
        {"code": "runtime_error", "detail": f"{type(exc).__name__} in the worker while {doing}"}
    )


def carried_history(
    rows: list[dict[str, Any]], encode: Callable[[Any], Any]
) -> list[dict[str, Any]]:
    """History rows with each input or result ``encode`` cannot carry (a row
    written before the depth bound, too deep to pickle or to write as JSON)
    replaced by a note: one such row must not fail every later turn of its
    endpoint. Called only after encoding the whole history failed."""
    carried = []
    for row in rows:
        try:
            encode(row)
        except Exception:
            row = dict(row)
            for key in ("input", "result"):
                try:
                    encode(row[key])
                except Exception:
                    row[key] = {"unavailable": "nested too deeply to hand to a runner"}
        carried.append(row)
    return carried


# --- What a runner gets --------------------------------------------------------------


@dataclass
class TurnContext:
    ticket_id: uuid.UUID
    turn_id: uuid.UUID
    seq: int
    endpoint: str
    input: dict[str, Any]
    deadline: datetime
    runner: dict[str, Any]
    interrupt_grace_s: float
    _interrupt: threading.Event
    _heartbeat: Callable[[], bool]
    _children_of: Callable[[str], list[dict[str, Any]]]
    # The credential of this turn for the turn API (/api/v1/turns/{id}/...):
    # in the envelope, never in a repr, a log line or the ledger.
    token: str = field(default="", repr=False)
    # Who submitted the ticket (a user's id; None: the runtime admitted it):
    # whose memory a per-submitter agent recalls (runtime/agents/memory.py).
    submitter: int | None = None
    # The endpoint's recent context entries, read when the runner first asks
    # (``history``): a turn that never looks costs no query for them.
    _history_rows: list[dict[str, Any]] | None = field(default=None, repr=False)
    _load_history: Callable[[], list[dict[str, Any]]] | None = field(default=None, repr=False)
    # A turn event written now, by the supervisor (tool receipts, usage): a
    # worker that dies later leaves what was recorded before.
    _record: Callable[[dict[str, Any]], bool] | None = field(default=None, repr=False)
    # The state of one of this endpoint's tickets (a resumed agent checks the
    # ticket it would complete is still waiting).
    _ticket_state: Callable[[str], str | None] | None = field(default=None, repr=False)
    # The agent continuation one of this endpoint's waiting tickets waits on
    # now (its last wait's), or None.
    _continuation_of: Callable[[str], dict[str, Any] | None] | None = field(
        default=None, repr=False
    )
    # The endpoint generation the turn runs under, and its notes for the next
    # run (an approved lesson's "check the tool first", a role guide line):
    # every turn of that generation is handed them.
    generation: int = 1
    notes: str = ""
    # A re-run or retry of a ticket whose side-effecting tool calls never
    # recorded an end: those calls ({tool, call_id, args_sha256,
    # idempotency_key, ticket, turn}). A tool sends the key in doubt with
    # its own new key, so the system it changes can recognise a repeat.
    keys_in_doubt: list[dict[str, Any]] = field(default_factory=list)

    @property
    def history(self) -> list[dict[str, Any]]:
        if self._history_rows is None:
            self._history_rows = self._load_history() if self._load_history else []
        return self._history_rows

    def heartbeat(self) -> bool:
        """Record liveness now; returns whether an interrupt was requested."""
        return self._heartbeat()

    def interrupted(self) -> bool:
        return self._interrupt.is_set()

    def wait_interrupted(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on an interrupt."""
        return self._interrupt.wait(timeout)

    def children_of(self, ticket_id: str) -> list[dict[str, Any]]:
        """The children of one of this endpoint's tickets: id, dedupe_key,
        input, state, result, error."""
        return self._children_of(ticket_id)

    def record(self, event: dict[str, Any]) -> bool:
        """Write a turn event now (``{"kind": ..., **detail}``): a tool
        receipt or the usage. True when it was written."""
        return bool(self._record(event)) if self._record else False

    def ticket_state(self, ticket_id: str) -> str | None:
        """The state of one of this endpoint's tickets (None: not one of them)."""
        return self._ticket_state(ticket_id) if self._ticket_state else None

    def continuation(self, ticket_id: str) -> dict[str, Any] | None:
        """What one of this endpoint's waiting tickets waits on now: the
        ``agent`` part of its last wait's continuation (``{exchange, round,
        pending}``); None when it is not waiting, not an agent's, not ours."""
        return self._continuation_of(ticket_id) if self._continuation_of else None

    def envelope(self) -> dict[str, Any]:
        return {
            "turn": {
                "id": str(self.turn_id),
                "seq": self.seq,
                "generation": self.generation,
                "deadline_at": self.deadline.isoformat(),
                # For the turn API: ``Authorization: Bearer <token>``.
                "token": self.token,
            },
            "ticket": {"id": str(self.ticket_id), "input": self.input},
            "keys_in_doubt": self.keys_in_doubt,
            "endpoint": self.endpoint,
            "notes": self.notes,
            "history": self.history,
            "trace": tracing.envelope_trace(),  # {trace_id, traceparent} of the ticket's trace
        }


# --- The operator's allow-list -----------------------------------------------------------


def _redacted(value: Any, token: str, label: str = "[turn token]") -> Any:
    if isinstance(value, str):
        return value.replace(token, label)
    if isinstance(value, dict):
        return {_redacted(k, token, label): _redacted(v, token, label) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, token, label) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _redacted(getattr(value, f.name), token, label)
            for f in dataclasses.fields(value)
        }
        return dataclasses.replace(value, **changes)
    return value


def redact_token(outcome: Outcome, token: str) -> Outcome:
    """The turn's token never reaches the ledger: a command that echoes its
    stdin into stderr or a bad reply, or a runner that returns (or passes on
    to its children) its envelope, would otherwise write it into the
    ticket's result or error, the events and the stop evidence. The token is
    URL-safe text, so its presence shows in the repr unescaped."""
    if not token or token not in repr(outcome):
        return outcome
    return _redacted(outcome, token)


def coerce(value: Any) -> Outcome:
    """Turn what a runner returned into an Outcome."""
    if isinstance(value, Outcome):
        return value
    if isinstance(value, Wait):
        return Outcome("wait", wait=value)
    if isinstance(value, Resume):
        return Outcome("success", result=value.own_result, resume=value)
    return Outcome.success(value)


# --- python ----------------------------------------------------------------------------

PROCESS, INLINE = ISOLATIONS


def isolation(runner: dict[str, Any]) -> str:
    """Where a python runner's turn runs: ``process`` (the default, a forked
    child the worker can stop with signals) or ``inline`` (in the worker's
    pool process: cheaper, but an ignored interrupt means quarantine and a
    held slot). Other runner kinds are never inline (an ``agent`` always
    runs in its own process)."""
    if runner.get("kind") != "python":
        return PROCESS
    return INLINE if runner.get("isolation") == INLINE else PROCESS


def kill_after_s(runner: dict[str, Any], interrupt_grace_s: float) -> float:
    """SIGTERM to SIGKILL: the runner's ``kill_after_s``, else half the
    interrupt grace, at most 5 s (at least 0.5 s)."""
    value = runner.get("kill_after_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return min(float(value), KILL_AFTER_MAX_S)
    return max(0.5, min(5.0, interrupt_grace_s / 2))


def stop_window_s(runner: dict[str, Any], heartbeat_timeout_s: float, grace_s: float) -> float:
    """How long after an interrupt request the budget sweep waits for stop
    evidence before it quarantines: the grace; for an isolated python turn
    also the escalation (the beat that carries the flag, SIGTERM,
    ``kill_after_s``, SIGKILL and the reap)."""
    if runner_spec.runs_isolated(runner):
        interval = heartbeat_interval(heartbeat_timeout_s, grace_s)
        return grace_s + interval + kill_after_s(runner, grace_s) + 2.0 + 1.0
    return grace_s


def _load(path: str) -> Callable[[TurnContext], Any]:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RunnerError(f"cannot load python runner {path!r}: {exc}") from exc


def _run_python(ctx: TurnContext) -> Outcome:
    fn = _load(ctx.runner["path"])
    try:
        outcome = coerce(fn(ctx))
    except Exception as exc:  # the runner's failure is the ticket's failure
        log.info("python runner %s raised %r", ctx.runner["path"], exc)
        return Outcome.failure({"code": "runner_raised", "detail": f"{type(exc).__name__}: {exc}"})
    if ctx.interrupted():
        # The callable returned after the interrupt: that return is the
        # evidence that this turn stopped.
        return Outcome.stopped(
            "runner_returned", {"returned": outcome.kind, "after_interrupt": True}
        )
    return outcome


# --- command ---------------------------------------------------------------------------


def _run_command(ctx: TurnContext) -> Outcome:
    """Run ``argv`` in its own process group: the envelope as JSON on stdin;
    stdout must be one JSON object: ``{"result": ...}``, ``{"error": ...}`` or
    ``{"wait": {"children": [...], "continuation": ...}}``. On interrupt:
    SIGTERM to the group, then SIGKILL after ``kill_after_s``; the exit
    status from ``waitpid`` is the stop evidence."""
    argv = ctx.runner["argv"]
    kill_after = kill_after_s(ctx.runner, ctx.interrupt_grace_s)
    # Never the worker's own environment: it holds the database URL and the
    # project's secrets. SecretMissing fails the turn before anything runs.
    try:
        env, resolved = runner_spec.command_env(ctx.runner, dict(os.environ))
    except SecretMissing as exc:
        return Outcome.failure({"code": "secret_missing", "detail": exc.detail})
    # Nor the worker's files or /proc entries: the runner user's (runas.py).
    try:
        user = runas.current()
    except runas.Unavailable as exc:
        return Outcome.failure({"code": "runner_error", "detail": str(exc)})
    return _without_secrets(_command_outcome(ctx, argv, env, kill_after, user), resolved)


def _encoded_envelope(ctx: TurnContext) -> bytes | Outcome:
    """The envelope as JSON, or the turn's ``runtime_error`` when the worker
    cannot write it (the history again without what it cannot carry first)."""
    try:
        try:
            return json.dumps(ctx.envelope()).encode()
        except (RecursionError, ValueError, TypeError):
            ctx._history_rows = carried_history(ctx.history, json.dumps)
            return json.dumps(ctx.envelope()).encode()
    except RunnerError:
        raise
    except Exception as exc:
        log.exception("turn %s: its envelope could not be encoded", ctx.turn_id)
        return runtime_error(exc, "encoding the runner's envelope")


def _command_outcome(
    ctx: TurnContext,
    argv: list,
    env: dict[str, str],
    kill_after: float,
    user: runas.RunAs | None = None,
) -> Outcome:
    """The command's run, as ``_run_command`` says; its secrets not yet redacted."""
    # Encoded before the process starts: a failure here leaves nothing running.
    envelope = _encoded_envelope(ctx)
    if isinstance(envelope, Outcome):
        return envelope
    started, env = runas.command(user, argv, env)
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv comes from staff-managed config
            started,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: an interrupt stops all of it
            cwd=ctx.runner.get("cwd") or None,
            env=env,
        )
    except OSError as exc:
        raise RunnerError(f"cannot start {argv[0]!r}: {exc}") from exc

    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []

    def pump(stream, sink):
        for chunk in iter(lambda: stream.read(65536), b""):
            sink.append(chunk)

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, out_chunks), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err_chunks), daemon=True),
    ]
    for r in readers:
        r.start()
    try:
        proc.stdin.write(envelope)
        proc.stdin.close()
    except BrokenPipeError:
        pass

    pgid = proc.pid
    signals_sent: list[str] = []
    while proc.poll() is None:
        if ctx.wait_interrupted(0.1):
            _signal_group(pgid, signal.SIGTERM)
            signals_sent.append("SIGTERM")
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                signals_sent.append("SIGKILL")
                proc.wait()
            break
    code = proc.returncode
    # Reap anything left in the group (a grandchild that outlived the leader).
    _signal_group(pgid, signal.SIGKILL)
    for r in readers:
        r.join(timeout=2)
    # A long-lived worker must not leak two descriptors per turn; a reader
    # still blocked (a process outside the group holds the pipe) keeps its own.
    for reader, stream in zip(readers, (proc.stdout, proc.stderr), strict=True):
        if not reader.is_alive():
            stream.close()
    if signals_sent:
        return Outcome.stopped(
            "process_exit",
            {
                "pid": proc.pid,
                "returncode": code,
                "signal": signal.Signals(-code).name if code < 0 else None,
                "signals_sent": signals_sent,
            },
        )
    stdout = b"".join(out_chunks)
    stderr = b"".join(err_chunks)[-2000:].decode(errors="replace")
    if code != 0:
        return Outcome.failure(
            {"code": "command_failed", "detail": f"exit status {code}", "stderr": stderr}
        )
    try:
        body = inputs.loads_reply(stdout)
    except RecursionError:  # json's own limit, far past the bound
        return storable_failure("the command printed JSON nested too deeply to read")
    except ValueError:
        return Outcome.failure(
            {
                "code": "bad_output",
                "detail": "the command did not print one JSON object on stdout",
                "stdout_head": stdout[:500].decode(errors="replace"),
            }
        )
    return _from_reply(body, "command")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # pragma: no cover - not ours to signal
        log.warning("no permission to signal process group %s", pgid)


def _from_reply(body: Any, source: str) -> Outcome:
    """The outcome a command's stdout or an http agent's 200 reply says,
    checked before anything else walks it (the secrets' redaction, the
    token's, the finish): what the ledger cannot store fails the turn
    ``unstorable_result``."""
    return storable(_reply_outcome(body, source), f"the {source}")


def _reply_outcome(body: Any, source: str) -> Outcome:
    if not isinstance(body, dict):
        return Outcome.failure({"code": "bad_output", "detail": f"{source} reply is not an object"})
    if "error" in body and body["error"] is not None:
        return Outcome.failure(body["error"])
    if "wait" in body:
        spec = body["wait"] or {}
        try:
            children = [
                Child(endpoint=c["endpoint"], input=c["input"], dedupe_key=c.get("dedupe_key"))
                for c in spec.get("children", [])
            ]
        except (KeyError, TypeError):
            return Outcome.failure(
                {"code": "bad_output", "detail": "wait.children needs endpoint and input"}
            )
        return Outcome("wait", wait=Wait(children=children, continuation=spec.get("continuation")))
    if "result" in body:
        return Outcome.success(body["result"], artifacts=body.get("artifacts") or [])
    return Outcome.failure(
        {"code": "bad_output", "detail": f"{source} reply has no result, error or wait"}
    )


# --- http ------------------------------------------------------------------------------


def _run_http(ctx: TurnContext) -> Outcome:
    """POST the envelope to the agent with the runner's headers, their named
    secrets resolved on this host now (never stored: an agent that echoes
    one back has it replaced by ``[secret NAME]`` before the ledger sees the
    outcome). ``auth`` puts its secret in ``Authorization``; without it that
    header carries the turn's token (always in the envelope too)."""
    try:
        configured, resolved = runner_spec.secret_headers(ctx.runner)
    except SecretMissing as exc:
        return Outcome.failure({"code": "secret_missing", "detail": exc.detail})
    return _without_secrets(_post_to_agent(ctx, configured), resolved)


def _without_secrets(outcome: Outcome, resolved: dict[str, str]) -> Outcome:
    """``outcome`` with every resolved secret value replaced by ``[secret
    NAME]``: what a runner prints or an agent echoes never reaches the ledger
    with a credential in it."""
    for value, name in resolved.items():
        if value:
            outcome = _redacted(outcome, value, f"[secret {name}]")
    return outcome


def _post_to_agent(ctx: TurnContext, configured: dict[str, str]) -> Outcome:
    """200 with a reply finishes the turn; 202 means the agent answers later
    via ``POST /api/v1/turns/{id}/result`` (and heartbeats through the API
    meanwhile)."""
    timeout = float(ctx.runner.get("timeout_s", 30))
    url = ctx.runner["url"]
    # The URL policy again, now (it was checked when the endpoint was set,
    # but DNS may answer differently today), and the send pinned to the
    # addresses it accepted: no second resolution (DNS rebinding).
    try:
        target = outbound.resolve_target(url, label="agent")
    except outbound.Unresolvable as exc:
        return Outcome.failure({"code": "agent_unreachable", "detail": exc.detail})
    except Invalid as exc:
        return Outcome.failure(
            {"code": "agent_url_refused", "detail": f"not sent to {url!r}: {exc.detail}"}
        )
    # Encoded before anything is sent: a failure here leaves nothing running.
    envelope = _encoded_envelope(ctx)
    if isinstance(envelope, Outcome):
        return envelope
    try:
        resp = outbound.post_pinned(
            url=url,
            target=target,
            body=envelope,
            # The turn's own credential: the agent answers (and heartbeats)
            # through the turn API with it, and can tell this call is ours.
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {ctx.token}",
                **configured,
                **tracing.outgoing_headers(),
            },
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        return Outcome.failure({"code": "agent_unreachable", "detail": str(exc)})
    if resp.status_code == 202:
        return Outcome.deferred()
    if resp.status_code != 200:
        return Outcome.failure(
            {"code": "agent_error", "detail": f"agent answered {resp.status_code}"}
        )
    try:
        body = inputs.loads_reply(resp.content)
    except RecursionError:  # json's own limit, far past the bound
        return storable_failure("the agent replied JSON nested too deeply to read")
    except ValueError:
        return Outcome.failure({"code": "bad_output", "detail": "agent reply is not JSON"})
    return _from_reply(body, "agent")


def cancel_http_turn(runner: dict[str, Any], turn_id: uuid.UUID, seq: int) -> None:
    """Ask an http agent to stop a turn (its stop receipt is the evidence)."""
    url = runner.get("cancel_url")
    if not url:
        return
    try:
        target = outbound.resolve_target(url, label="agent cancel")
        # The same credentials as the turn's POST, resolved on this host; a
        # runner the schema refuses gets none (its references are not trusted).
        headers: dict[str, str] = {}
        if runner_spec.problem(runner) is None:
            headers, _ = runner_spec.secret_headers(runner)
    except Invalid as exc:  # the URL policy, or a secret this host lacks
        log.warning("cancel of turn %s not sent to %s: %s", turn_id, url, exc.detail)
        return
    try:
        outbound.post_pinned(
            url=url,
            target=target,
            json={"turn": str(turn_id), "seq": seq},
            headers=headers,
            timeout=5,
        )
    except httpx.HTTPError as exc:
        log.warning("cancel of turn %s at %s failed: %s", turn_id, url, exc)


def heartbeat_interval(heartbeat_timeout_s: float, interrupt_grace_s: float | None = None) -> float:
    """How often a worker heartbeats a turn: three beats per timeout, at most
    every 5 s, and at least twice per interrupt grace, because the beat is
    how a python runner hears its interrupt: a beat slower than the grace
    would quarantine a turn that stops as soon as it is asked."""
    interval = min(heartbeat_timeout_s / 3, 5.0)
    if interrupt_grace_s is not None:
        interval = min(interval, interrupt_grace_s / 2)
    return max(0.2, interval)
