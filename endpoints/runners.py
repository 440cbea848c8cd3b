"""Runners execute one turn: ``python`` (a callable), ``command`` (a
subprocess in its own process group, JSON in and out) and ``http`` (an agent
service that answers at once or later through the turn API).

A runner gets a ``TurnContext`` and returns an ``Outcome``. Stop evidence is
runner-aware: only the runner that owns the work can say it ended (the python
callable returned; the command's process group was reaped by ``waitpid``; the
agent posted a stop receipt).
"""

from __future__ import annotations

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
    (or ``error``), or leave it waiting (``keep_waiting``). The callback
    ticket itself succeeds with ``own_result``."""

    ticket: str
    result: Any = None
    error: Any = None
    keep_waiting: bool = False
    own_result: Any = None


@dataclass
class Outcome:
    kind: str  # success | failure | wait | stopped | deferred
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
    def deferred(cls) -> Outcome:
        """An http agent accepted the turn and will answer through the API."""
        return cls("deferred")


class RunnerError(Exception):
    """A runner could not produce an outcome; the message says why."""


# --- What a runner gets --------------------------------------------------------------


@dataclass
class TurnContext:
    ticket_id: uuid.UUID
    turn_id: uuid.UUID
    seq: int
    endpoint: str
    input: dict[str, Any]
    history: list[dict[str, Any]]
    deadline: datetime
    runner: dict[str, Any]
    interrupt_grace_s: float
    _interrupt: threading.Event
    _heartbeat: Callable[[], bool]
    _children_of: Callable[[str], list[dict[str, Any]]]

    def heartbeat(self) -> bool:
        """Record liveness now; returns whether an interrupt was requested."""
        return self._heartbeat()

    def interrupted(self) -> bool:
        return self._interrupt.is_set()

    def wait_interrupted(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on an interrupt."""
        return self._interrupt.wait(timeout)

    def children_of(self, ticket_id: str) -> list[dict[str, Any]]:
        """The children of one of this endpoint's tickets: id, state, result, error."""
        return self._children_of(ticket_id)

    def envelope(self) -> dict[str, Any]:
        return {
            "turn": {
                "id": str(self.turn_id),
                "seq": self.seq,
                "deadline_at": self.deadline.isoformat(),
            },
            "ticket": {"id": str(self.ticket_id), "input": self.input},
            "endpoint": self.endpoint,
            "history": self.history,
        }


def run(ctx: TurnContext) -> Outcome:
    kind = ctx.runner.get("kind")
    try:
        if kind == "python":
            return _run_python(ctx)
        if kind == "command":
            return _run_command(ctx)
        if kind == "http":
            return _run_http(ctx)
        raise RunnerError(f"unknown runner kind {kind!r}")
    except RunnerError as exc:
        return Outcome.failure({"code": "runner_error", "detail": str(exc)})


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
    kill_after = float(ctx.runner.get("kill_after_s", min(5.0, ctx.interrupt_grace_s / 2)))
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv comes from staff-managed config
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: an interrupt stops all of it
            cwd=ctx.runner.get("cwd") or None,
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
        proc.stdin.write(json.dumps(ctx.envelope()).encode())
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
        body = json.loads(stdout)
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
    """POST the envelope to the agent. 200 with a reply finishes the turn;
    202 means the agent answers later via ``POST /api/v1/turns/{id}/result``
    (and heartbeats through the API meanwhile)."""
    timeout = float(ctx.runner.get("timeout_s", 30))
    try:
        resp = httpx.post(ctx.runner["url"], json=ctx.envelope(), timeout=timeout)
    except httpx.HTTPError as exc:
        return Outcome.failure({"code": "agent_unreachable", "detail": str(exc)})
    if resp.status_code == 202:
        return Outcome.deferred()
    if resp.status_code != 200:
        return Outcome.failure(
            {"code": "agent_error", "detail": f"agent answered {resp.status_code}"}
        )
    try:
        body = resp.json()
    except ValueError:
        return Outcome.failure({"code": "bad_output", "detail": "agent reply is not JSON"})
    return _from_reply(body, "agent")


def cancel_http_turn(runner: dict[str, Any], turn_id: uuid.UUID, seq: int) -> None:
    """Ask an http agent to stop a turn (its stop receipt is the evidence)."""
    url = runner.get("cancel_url")
    if not url:
        return
    try:
        httpx.post(url, json={"turn": str(turn_id), "seq": seq}, timeout=5)
    except httpx.HTTPError as exc:
        log.warning("cancel of turn %s at %s failed: %s", turn_id, url, exc)


def heartbeat_interval(heartbeat_timeout_s: float) -> float:
    return max(0.2, min(heartbeat_timeout_s / 3, 5.0))
