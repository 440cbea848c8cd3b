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
        },
        "formatters": {"main": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "main",
                "filters": ["routine", "context", "redact"],
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
