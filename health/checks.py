"""Readiness: can this deployment do its work right now? (/readyz and the
console's dashboard.) Each check is bounded in time and names no host, URL
or server message: the answers are safe to show without authentication."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.transient import TRANSIENT_ERRORS, drop_broken_connection

DB_STATEMENT_TIMEOUT_MS = 1000
BROKER_TIMEOUT_S = 1.0
# A sweep is missing when it has not finished for this many of its periods.
SWEEP_PERIODS_ALLOWED = 3


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, **self.data}


@dataclass
class Readiness:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    @property
    def missing_sweeps(self) -> list[Check]:
        return [c for c in self.checks if c.name.startswith("sweep:") and not c.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ready": self.ok,
            "failed": self.failed,
            "checks": {c.name: c.as_dict() for c in self.checks},
        }


def _timed(fn) -> tuple[bool, str, float]:
    started = time.monotonic()
    try:
        fn()
    except TRANSIENT_ERRORS as exc:
        return False, f"unreachable ({type(exc).__name__})", _ms(started)
    except Exception as exc:  # a readiness probe reports, it never raises
        return False, f"failed ({type(exc).__name__})", _ms(started)
    return True, "ok", _ms(started)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def check_database() -> Check:
    def probe() -> None:
        with transaction.atomic(), connection.cursor() as cur:
            # A database that accepts connections but hangs fails in 1 s.
            cur.execute(f"SET LOCAL statement_timeout = {int(DB_STATEMENT_TIMEOUT_MS)}")
            cur.execute("SELECT 1")
            cur.fetchone()

    ok, detail, ms = _timed(probe)
    if not ok:
        drop_broken_connection()
    return Check("database", ok, detail, {"ms": ms})


def check_broker() -> Check:
    url = settings.CELERY_BROKER_URL

    def probe() -> None:
        if url.startswith(("redis://", "rediss://", "redis+socket://")):
            import redis

            timeouts = {
                "socket_connect_timeout": BROKER_TIMEOUT_S,
                "socket_timeout": BROKER_TIMEOUT_S,
            }
            if url.startswith("redis+socket://"):  # the embedded Redis (core/embedded.py)
                path = url.removeprefix("redis+socket://").split("?", 1)[0]
                client = redis.Redis(unix_socket_path=path, **timeouts)
            else:
                client = redis.Redis.from_url(url, **timeouts)
            try:
                client.ping()
            finally:
                client.close()
        else:  # another kombu transport
            from celery import current_app

            with current_app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)

    ok, detail, ms = _timed(probe)
    return Check("broker", ok, detail, {"ms": ms})


def check_sweeps(now: datetime | None = None) -> list[Check]:
    """Each sweep must have finished within ``SWEEP_PERIODS_ALLOWED`` of its
    periods: otherwise beat or the control worker is down, and overruns go
    unpunished, lost dispatches and deliveries wait."""
    from core.sweeps import SWEEP_TASKS, sweep_intervals

    from .models import SweepRun

    now = now or timezone.now()
    last = dict(SweepRun.objects.values_list("name", "last_finished_at"))
    checks = []
    for name, period in sweep_intervals().items():
        # A sweep beat sends more often than the common period (the schedules'
        # tick) is held to that period: a webhook attempt on the one control
        # process delays it by seconds while nothing is down.
        limit = SWEEP_PERIODS_ALLOWED * max(period, settings.SWEEP_INTERVAL_S)
        at = last.get(name)
        age = (now - at).total_seconds() if at else None
        ok = age is not None and age <= limit
        if at is None:
            detail = "has never run: is celery beat running, and a worker on the control queue?"
        elif ok:
            detail = "ok"
        else:
            detail = (
                f"last ran {age:.0f}s ago (allowed {limit:g}s): is celery beat running, "
                "and a worker on the control queue?"
            )
        checks.append(
            Check(
                f"sweep:{name}",
                ok,
                detail,
                {
                    "task": SWEEP_TASKS[name],
                    "last_finished_at": at.isoformat() if at else None,
                    "age_s": round(age, 1) if age is not None else None,
                    "max_age_s": limit,
                },
            )
        )
    return checks


def readiness(*, probe_database: bool = True) -> Readiness:
    """Every check. ``probe_database=False`` for a page that has just read the
    database anyway (the dashboard): no extra round trips for it."""
    database = (
        check_database()
        if probe_database
        else Check("database", True, "ok (this page was read from it)")
    )
    checks = [database, check_broker()]
    if checks[0].ok:
        try:
            checks += check_sweeps()
        except TRANSIENT_ERRORS as exc:
            drop_broken_connection()
            checks.append(Check("sweeps", False, f"unknown ({type(exc).__name__})"))
    else:
        checks.append(Check("sweeps", False, "unknown: the database is unreachable"))
    return Readiness(checks)
