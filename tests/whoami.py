"""A python runner for tests/test_database_roles.py: reports which role the
worker's database connection is."""

from __future__ import annotations

from django.db import connection


def whoami(ctx) -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute("SELECT current_user, session_user")
        current, session = cur.fetchone()
    return {"current_user": current, "session_user": session}
