"""Structured logs: the ids a line concerns, JSON or console, no secrets.

``LOG_FORMAT=json`` writes one JSON object per line (python-json-logger);
``console`` (the default, for ``make run``) writes the classic line with the
ids appended. Either way every line logged while a request, a turn or a
delivery is being handled carries the ids bound for it:

- web: ``request_id`` (the client's ``X-Request-ID`` when it is sane, else a
  new one; echoed on the response), ``trace_id`` from a W3C ``traceparent``
  (``RequestContextMiddleware``);
- workers: ``task`` and ``task_id`` for every task (Celery signals in
  ``config/celery.py``), then ``ticket_id``, ``turn_id``, ``seq``,
  ``endpoint`` and ``trace_id`` once a turn starts (bound by
  ``config/observe.transition`` from the ``turn_started`` transition), and
  ``delivery_id`` / ``ticket_id`` / ``trace_id`` for a webhook attempt.

Nothing here logs an input, a result, an API key, a turn token or the
signing secret; ``RedactFilter`` masks bearer tokens and ``whsec_`` keys in
case a message ever carries one. Celery's per-task "received"/"succeeded"
lines and beat's "sending due task" for the routine sweeps are DEBUG
(``RoutineFilter``): a sweep that did nothing says nothing at INFO.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

# The fields a line may carry, in the order the console format prints them.
FIELDS = (
    "request_id",
    "task",
    "task_id",
    "ticket_id",
    "turn_id",
    "seq",
    "endpoint",
    "trace_id",
    "delivery_id",
)

_context: ContextVar[dict[str, Any] | None] = ContextVar("claimcheck_log_context", default=None)


def current() -> dict[str, Any]:
    return dict(_context.get() or {})


def bind(**fields: Any) -> Token:
    """Add ``fields`` to every line logged from here in this context; returns
    the token that ``unbind`` takes to restore what was bound before."""
    merged = current()
    merged.update({k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in fields.items()})
    return _context.set(merged)


def unbind(token: Token) -> None:
    _context.reset(token)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def clear() -> None:
    _context.set(None)


class ContextFilter(logging.Filter):
    """Copy the bound ids onto the record (an ``extra=`` of the call wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if value is not None and value != "" and not hasattr(record, key):
                setattr(record, key, value)
        return True


_SECRET_PATTERNS = [
    (re.compile(r"(?i)(bearer\s+)[^\s'\",]+"), r"\1[redacted]"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), "whsec_[redacted]"),
    (
        re.compile(r"(?i)((?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)[^\s'\",}]+"),
        r"\1[redacted]",
    ),
]


class RedactFilter(logging.Filter):
    """Mask anything shaped like a credential in the rendered message: a
    safety net, the code itself never logs one."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is logging's own problem
            return True
        redacted = message
        for pattern, repl in _SECRET_PATTERNS:
            redacted = pattern.sub(repl, redacted)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


# Celery's per-task lines and beat's schedule line, for tasks beat runs every
# few seconds: DEBUG, so a quiet system has a quiet log.
_ROUTINE_LOGGERS = {"celery.worker.strategy", "celery.app.trace", "celery.beat"}


def _is_routine(task_name: str) -> bool:
    return ".sweep_" in task_name or task_name.endswith(".prune_ledger")


class RoutineFilter(logging.Filter):
    """Demote Celery's "received", "succeeded" and beat's "Sending due task"
    lines of the routine sweeps to DEBUG (and drop them unless the root
    level lets DEBUG through). Failures of a sweep keep their level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name not in _ROUTINE_LOGGERS or record.levelno != logging.INFO:
            return True
        args = record.args
        if isinstance(args, dict):
            name = str(args.get("name", ""))
        elif isinstance(args, tuple) and len(args) >= 2:
            name = str(args[1])  # beat: (entry name, task name)
        else:
            return True
        if not _is_routine(name):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


# Pool processes killed on purpose (an owner's "stop the process"): pid ->
# [why, when, the pool's own line seen, the task's line seen].
_expected_exits: dict[int, list[Any]] = {}
_expected_lock = threading.Lock()
# How long after the kill the pool's lines about it are recognised.
EXPECTED_EXIT_WINDOW_S = 60.0
_BILLIARD_EXIT = "Process %r pid:%r exited with %r"
_TASK_LOST = "Task handler raised error: %r"


def expect_exit(pid: int, because: str) -> None:
    """This process is about to kill pool process ``pid`` on purpose
    (``because`` names who decided it): the pool's ERROR lines about it
    (billiard's "exited with", Celery's ``WorkerLostError`` with its
    traceback) are logged as one WARNING each, naming the reason
    (``ExpectedExitFilter``), so alerting does not fire on a deliberate act."""
    with _expected_lock:
        _expected_exits[pid] = [because, time.monotonic(), False, False]


def _expected_for(record: logging.LogRecord) -> str | None:
    args = record.args if isinstance(record.args, tuple) else ()
    now = time.monotonic()
    with _expected_lock:
        for pid, entry in list(_expected_exits.items()):
            if now - entry[1] > EXPECTED_EXIT_WINDOW_S or (entry[2] and entry[3]):
                del _expected_exits[pid]
        if record.msg == _BILLIARD_EXIT and len(args) == 3:
            entry = _expected_exits.get(args[1])
            if entry is not None and not entry[2]:
                entry[2] = True
                return entry[0]
        elif record.msg == _TASK_LOST and args and type(args[0]).__name__ == "WorkerLostError":
            # Its line names a job, not a pid: the oldest kill not yet matched.
            waiting = sorted((e for e in _expected_exits.values() if not e[3]), key=lambda e: e[1])
            if waiting:
                waiting[0][3] = True
                return waiting[0][0]
    return None


class ExpectedExitFilter(logging.Filter):
    """The pool's lines about a process killed on purpose (``expect_exit``)
    as WARNING with the reason and no traceback; every other line as is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not _expected_exits:
            return True
        because = _expected_for(record)
        if because is not None:
            message = record.getMessage()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "%s: %s", (because, message)
            record.exc_info = record.exc_text = record.stack_info = None
        return True


class ConsoleFormatter(logging.Formatter):
    """The classic line, with the bound ids as ``key=value`` at the end."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if hasattr(record, k))
        return f"{line} [{ids}]" if ids else line


def logging_config(*, fmt: str, level: str) -> dict[str, Any]:
    """The ``LOGGING`` dict for settings.py."""
    if fmt not in ("json", "console"):
        raise ValueError("LOG_FORMAT must be json or console")
    formatter = (
        {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "timestamp": False,
        }
        if fmt == "json"
        else {"()": "core.logs.ConsoleFormatter"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": "core.logs.ContextFilter"},
            "redact": {"()": "core.logs.RedactFilter"},
            "routine": {"()": "core.logs.RoutineFilter"},
            "expected_exit": {"()": "core.logs.ExpectedExitFilter"},
        },
        "formatters": {"main": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "main",
                "filters": ["expected_exit", "routine", "context", "redact"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django.db.backends": {"level": "WARNING"},
            # Celery's own loggers propagate to the root handler (the worker
            # does not hijack the root logger: config/celery.py).
            "celery": {"level": level},
            # The MCP SDK logs the start and end of every request's server
            # (config/mcp.py runs one per request) at INFO.
            "mcp": {"level": "WARNING"},
        },
    }
