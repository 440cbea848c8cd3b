"""Slow clients without a key hold gunicorn's gthread threads; nginx as
deployed (deploy/nginx.conf, docs/howto/deploy.md) in front of it does not let
them, and refuses a flood per client address at the edge in the API's shape.

gunicorn runs with the production configuration (deploy/gunicorn.conf.py),
sized down to one process of two threads, on the test database."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests import nginx
from tests.conftest import _test_env, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not nginx.available(), reason="nginx needed (make test installs it)"),
]

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2


@pytest.fixture
def web(transactional_db, tmp_path):
    port = nginx.free_port()
    env = {
        **_test_env(),
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
        "GUNICORN_THREADS": str(THREADS),
    }
    with open(tmp_path / "web.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application",
             "-c", str(ROOT / "deploy" / "gunicorn.conf.py")],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: _status(f"http://127.0.0.1:{port}/healthz") == 200, timeout=120)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _status(url: str, timeout: float = 5.0, **kw) -> int | None:
    try:
        # Plain HTTP, polled: verify=False spares loading the CA bundle into
        # a TLS context at every call (most of a poll's CPU).
        return httpx.get(url, timeout=timeout, verify=False, **kw).status_code
    except httpx.HTTPError:
        return None


def _at_once(port: int, path: str, authorization: str, count: int) -> list[tuple]:
    """``count`` GETs on as many connections, opened first and then sent in
    one tight loop (so they reach nginx within milliseconds, whatever the
    machine's load); (status, headers, body) of each."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(count)]
    try:
        for s in sockets:
            s.sendall(request)
        answers = []
        for s in sockets:
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            answers.append((int(lines[0].split()[1]), headers, body))
        return answers
    finally:
        for s in sockets:
            s.close()


def _slow_clients(port: int, count: int) -> list[socket.socket]:
    """Sockets that announce a 100 kB login form, send a few bytes of it and
    stall: no key or session needed, and the form is read (the input guard,
    CSRF) before anything can refuse it."""
    head = (
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"
        b"username=a"
    )
    made = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head)
        made.append(s)
    return made


def test_nginx_in_front_holds_slow_bodies_and_refuses_a_flood_per_address(web, tmp_path):
    """One gunicorn for both halves: it starts slowly on a loaded machine."""
    _slow_bodies_hold_gunicorn_threads_but_not_through_nginx(web, tmp_path)
    _the_edge_refuses_a_flood_per_address_in_the_api_shape(web, tmp_path)
    _the_edge_paces_a_key_rather_than_refusing_ordinary_clients(web, tmp_path)


def _slow_bodies_hold_gunicorn_threads_but_not_through_nginx(web, tmp_path):
    with nginx.Nginx(upstream=web, directory=tmp_path / "nginx") as proxy:
        stalled = _slow_clients(proxy.port, THREADS * 3)
        try:
            # nginx buffers them; gunicorn never sees them and serves the rest.
            for _ in range(5):
                assert _status(f"http://127.0.0.1:{proxy.port}/healthz", timeout=3) == 200
        finally:
            for s in stalled:
                s.close()

    # The same sockets straight to gunicorn: each holds a thread until its
    # body arrives, and a plain request gets no answer meanwhile.
    stalled = _slow_clients(web, THREADS * 3)
    try:
        assert _status(f"http://127.0.0.1:{web}/healthz", timeout=3) is None
    finally:
        for s in stalled:
            s.close()
    wait_for(lambda: _status(f"http://127.0.0.1:{web}/healthz") == 200, message="threads back")


FLOOD = 240


def _read_answer(sock: socket.socket) -> tuple[int, str, str]:
    """(status, head, body) of the one answer on a ``Connection: close`` socket."""
    sock.settimeout(60)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.decode(), body.decode()


def _the_edge_refuses_a_flood_per_address_in_the_api_shape(web, tmp_path):
    """Random bad keys, each a different Authorization value, from one
    address, on the API and /mcp: the edge counts the address, so the flood
    is refused there, and a caller from another address still reaches the
    application."""
    with nginx.Nginx(upstream=web, directory=tmp_path / "nginx-edge") as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        # Every connection opened first, then each request written in one
        # send: they arrive together (Python building 240 HTTP requests one
        # by one on a loaded host could spread them below the rate).
        paths = ["/api/v1/tickets", "/mcp"] * (FLOOD // 2)
        sockets = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in paths]
        try:
            for path, sock in zip(paths, sockets, strict=True):
                key = f"cc_{secrets.token_hex(4)}_{secrets.token_urlsafe(16)}"
                sock.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                    "Content-Length: 2\r\n\r\n{}".encode()
                )
            answers = [
                (path, _read_answer(sock)) for path, sock in zip(paths, sockets, strict=True)
            ]
        finally:
            for sock in sockets:
                sock.close()
        # The burst of 100 passes (401: no such key), the rest is refused by
        # nginx, /mcp's as the API's.
        statuses = {status for _, (status, _, _) in answers}
        assert 429 in statuses and statuses <= {401, 429}, answers
        refused = [(path, head, body) for path, (status, head, body) in answers if status == 429]
        assert {path for path, _, _ in refused} == {"/api/v1/tickets", "/mcp"}
        assert "\r\nRetry-After: 1\r\n" in refused[0][1]
        assert "\r\nRateLimit-Remaining: 0\r\n" in refused[0][1]
        assert json.loads(refused[0][2]) == {
            "error": "rate_limited",
            "detail": "over the edge limit (50 requests a second from this address, 20 with "
            "this key, and 100 waiting); retry after the Retry-After seconds",
            "limit": 20,
            "retry_after": 1,
        }
        # Another address is not refused for it (all of 127/8 is this host).
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=elsewhere, timeout=30) as c:
            other = c.get(base + "/api/v1/tickets?limit=1", headers={"Authorization": "Bearer x"})
        assert other.status_code == 401
        # /metrics is not served through the proxy (every client would be 127.0.0.1).
        assert _status(f"http://127.0.0.1:{proxy.port}/metrics") == 404


def _the_edge_paces_a_key_rather_than_refusing_ordinary_clients(web, tmp_path):
    """A fan-out of 50 passes the edge at once, a loader of 16 threads is
    paced, never refused, and only a real flood of one key is cut to the
    burst; a caller elsewhere is not refused for it."""
    with nginx.Nginx(upstream=web, directory=tmp_path / "nginx-pace") as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/v1/tickets?limit=1"
        path = "/api/v1/tickets?limit=1"
        # An orchestrator's fan-out of 50 at once passes the edge undelayed
        # (401: no such key, answered by the application).
        fan_out = _at_once(proxy.port, path, "Bearer fan-out", 50)
        assert {status for status, _, _ in fan_out} == {401}
        # A loader of 16 threads is paced, never refused: at most 16 of its
        # requests wait at a time, within the burst.
        loaded: list[int] = []

        def loader() -> None:
            with httpx.Client(headers={"Authorization": "Bearer loader"}, timeout=60) as c:
                loaded.extend(c.get(url).status_code for _ in range(8))

        threads = [threading.Thread(target=loader) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert loaded.count(401) == 128, sorted(set(loaded))
        # 500 requests of one key at once, each on its own connection, all
        # sent within milliseconds (the connections opened first): a burst of
        # 100 passes (the last 50 paced at 20 a second), the rest are refused.
        answers = _at_once(proxy.port, path, "Bearer flood", 500)
        statuses = [status for status, _, _ in answers]
        assert set(statuses) == {401, 429} and 100 <= statuses.count(401) < 200, statuses
        headers, raw = next((h, b) for status, h, b in answers if status == 429)
        body = json.loads(raw)
        assert (body["error"], body["limit"]) == ("rate_limited", 20)
        assert headers["Retry-After"] == "1"
        assert headers["RateLimit-Remaining"] == "0"
        # A caller at another address is not refused for it.
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=elsewhere, timeout=30) as c:
            other = c.get(url, headers={"Authorization": "Bearer calm"})
        assert other.status_code == 401
