"""The kept connection's health check (core/postgresql/base.py): no
statement on a healthy idle connection, Django's SELECT 1 whenever the
socket or the session state says something may be wrong."""

from __future__ import annotations

import select

import psycopg
import pytest
from django.db import connection

from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _counting_cursors(monkeypatch) -> list[int]:
    """Count the statements the check sends (Django's SELECT 1 goes through
    the raw psycopg connection's cursor(), past Django's wrappers)."""
    opened: list[int] = []
    raw = connection.connection
    real = raw.cursor
    monkeypatch.setattr(raw, "cursor", lambda *a, **k: opened.append(1) or real(*a, **k))
    return opened


def _arm() -> None:
    # What request_started does under a real server.
    connection.health_check_done = False


def test_a_healthy_idle_connection_is_kept_without_a_statement(monkeypatch):
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    opened = _counting_cursors(monkeypatch)
    _arm()
    connection.close_if_health_check_failed()
    assert opened == []
    assert connection.connection is not None
    assert connection.connection.info.backend_pid == pid


def test_a_connection_its_server_closed_is_replaced_before_the_query():
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.update(user="postgres")
    params.pop("password", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        # With a timeout the call returns once the backend has exited, as a
        # restart is over before the next request: its FATAL is on our socket.
        assert admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]
    _arm()
    connection.close_if_health_check_failed()
    assert connection.connection is None  # closed: the next query reconnects
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        assert cur.fetchone()[0] != pid


def test_a_connection_with_something_to_read_is_asked(monkeypatch):
    """Anything waiting on the socket (here a notification of a LISTEN the
    web never makes) sends the check to the server, which finds it good."""
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("LISTEN claimcheck_health_probe")
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("NOTIFY claimcheck_health_probe")
    fd = connection.connection.fileno()
    wait_for(
        lambda: select.select([fd], [], [], 0)[0],
        timeout=10,
        message="the notification on the socket",
    )
    opened = _counting_cursors(monkeypatch)
    _arm()
    connection.close_if_health_check_failed()
    assert opened == [1]  # the SELECT 1
    assert connection.connection is not None
    with connection.cursor() as cur:
        cur.execute("UNLISTEN *")
