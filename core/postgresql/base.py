"""Django's PostgreSQL backend, with ``CONN_HEALTH_CHECKS`` that read the
socket instead of asking the server.

Django checks a kept connection before a request's first query with a
``SELECT 1``: one more round trip on every request, which for a short
request (a one-row ``POST``, bench/http.py) is the largest single part of
its time in the worker. A connection a restart, ``pg_terminate_backend`` or a pooler
closed has the server's last words waiting on its socket (the FATAL
message, then end of file), and an idle connection has nothing to read:
PostgreSQL sends an idle session nothing unprompted but what this project
never asks of a web connection (it LISTENs on connections of its own,
DATABASE_LISTEN_URL). So:

- nothing to read, the connection idle outside a transaction and psycopg
  holding it good: usable, with no statement;
- anything else (something to read, a transaction open or failed, a
  connection psycopg knows broken): Django's own check, the ``SELECT 1``,
  decides, exactly as before.

What neither check sees is a peer that vanished without a word (a host
powered off): the ``SELECT 1`` would then hang as long as the query would.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base

try:
    from psycopg import pq
except ImportError:  # pragma: no cover - the project runs psycopg 3
    pq = None


class DatabaseWrapper(base.DatabaseWrapper):
    def function_cursor(self, *, prepared: bool):
        """What ``cursor()`` gives (the health check, the execute wrappers,
        the query log, Django's errors) over a psycopg cursor that binds its
        parameters on the server, and with ``prepared`` prepares every
        statement: for the transition functions' calls
        (core/sqlfunctions.call_cursor). Made directly, not by replacing the
        cursor ``cursor()`` made: a call is a fraction of a millisecond."""
        self.close_if_health_check_failed()
        self.ensure_connection()
        with self.wrap_database_errors:
            kind = PreparedCursor if prepared else base.ServerBindingCursor
            return self._prepare_cursor(kind(self.connection))

    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None:
            return False
        if pq is not None and _quiet_and_idle(conn):
            return True
        return super().is_usable()


class _QueryText:
    """What Django's query log reads of a psycopg cursor (``_query.query``)."""

    __slots__ = ("query",)

    def __init__(self, text: str) -> None:
        self.query = text.encode()


class PreparedCursor(base.ServerBindingCursor):
    """Server-side binding, every statement prepared (Django keeps psycopg's
    automatic preparation off)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        super().execute(query, params, prepare=True, binary=binary)
        if self._query is None:
            # psycopg records the query only when it does not run it
            # prepared; Django's query log (DEBUG, CaptureQueriesContext)
            # reads it.
            self._query = _QueryText(query)
        return self


def _quiet_and_idle(conn) -> bool:
    """Whether psycopg holds the connection good, idle outside a
    transaction, with nothing from the server waiting on its socket."""
    try:
        if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
            return False
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return False
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
