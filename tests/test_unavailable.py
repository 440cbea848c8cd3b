"""A database that is briefly unreachable answers 503 `unavailable` with
Retry-After: JSON under /api/, a small HTML page for the console; never a 500
or a stack trace (issue 9, finding 6).

In-process, the outage is the error psycopg gives when the server is gone,
raised by Django's own query path (``execute_wrapper``) for the statements a
test names. tests/test_db_outage.py stops a real PostgreSQL under a live
server."""

from __future__ import annotations

import contextlib
import json
import logging
import time

import pytest
from django.db import OperationalError, connection
from django.test import Client

from console.owners import create_owner

pytestmark = pytest.mark.django_db

DOWN = 'connection to server at "127.0.0.1", port 5432 failed: Connection refused'


@contextlib.contextmanager
def database_down(match=lambda sql: True):
    """Every statement ``match`` accepts fails as on a dead connection."""

    def wrapper(execute, sql, params, many, context):
        if match(sql):
            raise OperationalError(DOWN)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


def assert_unavailable_json(response):
    assert response.status_code == 503, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"] == "unavailable" and "briefly unreachable" in body["detail"]
    assert int(response["Retry-After"]) >= 1 and body["retry_after"] == int(response["Retry-After"])
    # The server's message (host, port) stays in the log.
    assert "5432" not in response.content.decode()


def test_api_auth_during_an_outage_is_503_not_500(api):
    with database_down():
        response = api.get("/tickets")
    assert_unavailable_json(response)


def test_a_route_body_during_an_outage_is_503(api, make_endpoint):
    make_endpoint("up")
    # Authentication passes; the route's own read fails.
    with database_down(lambda sql: "endpoints_endpoint" in sql):
        response = api.get("/endpoints/up")
    assert_unavailable_json(response)


def test_an_admission_during_an_outage_is_503(api, make_endpoint):
    make_endpoint("up")
    with database_down(lambda sql: "claimcheck_admit" in sql):
        response = api.post("/tickets", {"endpoint": "up", "input": {}})
    assert_unavailable_json(response)


def test_the_api_works_again_once_the_database_is_back(api, make_endpoint):
    make_endpoint("back")
    with database_down():
        assert api.get("/endpoints/back").status_code == 503
    assert api.get("/endpoints/back").status_code == 200


def test_a_console_page_during_an_outage_is_a_small_html_503(client, settings):
    client.force_login(create_owner(username="olive", password="pw-olive-1", endpoints=[]))
    with database_down():
        response = client.get("/")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert int(response["Retry-After"]) == settings.UNAVAILABLE_RETRY_AFTER_S
    page = response.content.decode()
    assert "database is briefly unavailable" in page
    assert "Traceback" not in page and "OperationalError" not in page and "5432" not in page


def test_an_outage_in_a_middleware_after_the_view_is_a_503_too():
    """The login view writes the new session, then SessionMiddleware saves it
    again on the way out: that UPDATE fails outside any view (handler500)."""
    create_owner(username="olive", password="pw-olive-1", endpoints=[])
    client = Client(raise_request_exception=False)
    with database_down(lambda sql: sql.startswith("UPDATE") and "django_session" in sql):
        response = client.post("/login/", {"username": "olive", "password": "pw-olive-1"})
    assert response.status_code == 503
    assert "briefly unavailable" in response.content.decode()
    with database_down(lambda sql: sql.startswith("UPDATE") and "django_session" in sql):
        response = client.get("/api/v1/tickets", HTTP_AUTHORIZATION="Bearer nope")
    assert response.status_code == 401  # no session write there: unaffected


def test_a_programming_error_is_still_a_500_internal(api, monkeypatch):
    from runtime import api as endpoints_api

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug, not an outage")

    monkeypatch.setattr(endpoints_api, "resolve_endpoint", broken)
    client = Client(raise_request_exception=False)
    response = client.get("/api/v1/endpoints/x", HTTP_AUTHORIZATION=f"Bearer {api.key}")
    assert response.status_code == 500
    assert json.loads(response.content)["error"] == "internal"


def test_mcp_during_an_outage_is_503_or_an_unavailable_tool_error(
    client, api_key, make_endpoint, settings
):
    """/mcp (config/mcp.py): an outage while the key is checked is the same
    503 as the API's; one inside a tool is a tool error ``unavailable`` with
    ``retry_after`` (the HTTP exchange itself succeeded)."""
    make_endpoint("up")
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_tickets", "arguments": {"endpoint": "up"}},
        }
    )
    headers = {
        "HTTP_AUTHORIZATION": f"Bearer {api_key}",
        "HTTP_ACCEPT": "application/json, text/event-stream",
        "HTTP_MCP_PROTOCOL_VERSION": "2025-06-18",
    }
    with database_down():
        response = client.post("/mcp", body, content_type="application/json", **headers)
    assert_unavailable_json(response)
    with database_down(lambda sql: "tickets_ticket" in sql):
        response = client.post("/mcp", body, content_type="application/json", **headers)
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["isError"] is True
    failed = result["structuredContent"]
    retry_after = max(1, int(settings.UNAVAILABLE_RETRY_AFTER_S))
    assert (failed["error"], failed["status"], failed["retry_after"]) == (
        "unavailable",
        503,
        retry_after,
    )
    assert "5432" not in response.content.decode()
    response = client.post("/mcp", body, content_type="application/json", **headers)
    assert response.json()["result"]["structuredContent"] == {"items": [], "next_cursor": None}


def test_mcp_tool_errors_in_an_outage_are_the_documented_503_logged_as_503s_are(
    client, api_key, make_endpoint, settings, caplog, monkeypatch
):
    """A tool that meets an outage answers the API's 503 body (docs/reference/mcp.md
    "Errors") and is logged as every 503 is: one WARNING naming /mcp, the
    tool and the cause, then none for the next calls within the second
    (the middleware's throttle, shared), never an ERROR."""
    from core import middleware

    make_endpoint("up")
    throttle = {"at": -1e9, "suppressed": 0}
    monkeypatch.setattr(middleware, "_unavailable_log", throttle)
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_tickets", "arguments": {"endpoint": "up"}},
        }
    )
    headers = {
        "HTTP_AUTHORIZATION": f"Bearer {api_key}",
        "HTTP_ACCEPT": "application/json, text/event-stream",
        "HTTP_MCP_PROTOCOL_VERSION": "2025-06-18",
    }
    retry_after = max(1, int(settings.UNAVAILABLE_RETRY_AFTER_S))
    with caplog.at_level(logging.INFO), database_down(lambda sql: "tickets_ticket" in sql):
        for _ in range(4):
            response = client.post("/mcp", body, content_type="application/json", **headers)
            assert response.status_code == 200
            result = response.json()["result"]
            assert result["isError"] is True
            assert result["structuredContent"] == {
                "error": "unavailable",
                "detail": f"the database is briefly unreachable; retry in {retry_after} s",
                "retry_after": retry_after,
                "status": 503,
            }
            assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelname for r in lines] == ["WARNING"], [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert message.startswith("503 unavailable for POST /mcp: tool list_tickets: ")
    assert "OperationalError" in message
    assert throttle["suppressed"] == 3


def test_503s_log_one_warning_a_second_with_their_cause_and_no_error(api, caplog, monkeypatch):
    """An outage is one event: a WARNING naming the cause at most once a
    second per process (with the count it stood for), never Django's
    ERROR line per 5xx."""
    from core import middleware

    # No line logged recently (raising=False: the test also runs on code without the throttle).
    throttle = {"at": -1e9, "suppressed": 0}
    monkeypatch.setattr(middleware, "_unavailable_log", throttle, raising=False)
    with caplog.at_level(logging.INFO), database_down():
        for _ in range(5):
            assert_unavailable_json(api.get("/tickets"))
        first = [r for r in caplog.records if r.levelno >= logging.WARNING]
        # A second later (as the throttle's clock sees it) the next 503 logs again.
        throttle["at"] = time.monotonic() - 1.01
        assert_unavailable_json(api.get("/endpoints"))
    assert [r.levelname for r in first] == ["WARNING"], [r.getMessage() for r in first]
    assert "503 unavailable for GET /api/v1/tickets" in first[0].getMessage()
    assert "OperationalError" in first[0].getMessage()  # the cause
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelname for r in lines] == ["WARNING", "WARNING"], [r.getMessage() for r in lines]
    assert "4 more 503s since the last line" in lines[1].getMessage()
