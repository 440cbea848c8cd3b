"""One sweeper of each kind at a time: a PostgreSQL advisory lock."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from django.db import connection

log = logging.getLogger(__name__)


# PostgreSQL advisory lock keys: one sweeper of each kind at a time.
_SWEEP_LOCKS = {"budgets": 7_401_001, "dispatch": 7_401_002}


@contextmanager
def sweep_lock(name: str):
    """Yields True if this process may run the sweep now. A session-level
    advisory lock, so each turn's transition can commit on its own."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [_SWEEP_LOCKS[name]])
        got = cur.fetchone()[0]
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [_SWEEP_LOCKS[name]])
