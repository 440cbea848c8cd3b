"""The connections that LISTEN: one server session each, for their whole life.

A notification reaches only the session that ran LISTEN. Behind a pooler in
transaction mode the LISTEN runs on whichever server connection the pooler
lends for that one statement, which then serves other clients: nothing ever
reaches the listener (a ``wait_s`` then waits its full time). So the
listeners (``tickets/waits.py``, ``runtime/dispatcher.py``) connect to
``DATABASE_LISTEN_URL`` when it is set: PostgreSQL directly or a pool in
session mode (docs/howto/pgbouncer.md); otherwise to ``DATABASE_URL`` like
everything else.

The parameters are read in the caller's thread (Django's connection settings
are per thread) and handed to the listener's own thread.
"""

from __future__ import annotations

from typing import Any

import environ
from django.conf import settings
from django.db import connection


def listen_params(name: str) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for a listening session,
    named ``name`` in ``pg_stat_activity`` (``application_name``)."""
    params = connection.get_connection_params()
    params["application_name"] = name
    url = settings.DATABASE_LISTEN_URL
    if not url:
        return params
    target = environ.Env.db_url_config(url)
    for key, param in (
        ("NAME", "dbname"),
        ("USER", "user"),
        ("PASSWORD", "password"),
        ("HOST", "host"),
        ("PORT", "port"),
    ):
        params.pop(param, None)
        if target.get(key):
            params[param] = target[key]
    params.update(target.get("OPTIONS") or {})
    return params


def connect_listener(params: dict[str, Any]):
    """An autocommit psycopg connection for LISTEN (``params`` from
    ``listen_params``)."""
    import psycopg

    return psycopg.connect(**params, autocommit=True)


def describe_target() -> str:
    """Where the listeners connect, for a log line (no password)."""
    url = settings.DATABASE_LISTEN_URL
    if not url:
        return "DATABASE_URL"
    target = environ.Env.db_url_config(url)
    return f"DATABASE_LISTEN_URL ({target.get('HOST') or 'socket'}:{target.get('PORT') or 5432})"
