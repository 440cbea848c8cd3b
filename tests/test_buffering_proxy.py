"""Slow clients without a key hold gunicorn's gthread threads; nginx as
deployed (deploy/nginx.conf, docs/deploy.md) in front of it does not let
them, and refuses a flood per client address at the edge in the API's shape.

gunicorn runs with the production configuration (deploy/gunicorn.conf.py),
sized down to one process of two threads, on the test database."""

from __future__ import annotations

import contextlib
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
        return httpx.get(url, timeout=timeout, **kw).status_code
    except httpx.HTTPError:
        return None


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


def _the_edge_refuses_a_flood_per_address_in_the_api_shape(web, tmp_path):
    """Random bad keys, each a different Authorization value, from one
    address, on the API and /mcp: the edge counts the address, so the flood
    is refused there, and a caller from another address still reaches the
    application."""
    with nginx.Nginx(upstream=web, directory=tmp_path / "nginx-edge") as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        answers: list[httpx.Response] = []
        lock = threading.Lock()
        ready = threading.Barrier(FLOOD)

        def one(path: str) -> None:
            key = f"cc_{secrets.token_hex(4)}_{secrets.token_urlsafe(16)}"
            # The client (its SSL context: milliseconds of CPU) made before the
            # start, so the requests leave together.
            with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
                ready.wait(timeout=60)
                r = c.post(base + path, json={})
            with lock:
                answers.append(r)

        # All at once (the application behind answers slower than 50 a
        # second here, so a closed loop of clients would never pass the rate):
        # the burst of 100 passes (401: no such key), the rest is refused by
        # nginx, /mcp's as the API's.
        paths = ["/api/v1/tickets", "/mcp"] * (FLOOD // 2)
        threads = [threading.Thread(target=one, args=(p,)) for p in paths]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refused = [r for r in answers if r.status_code == 429]
        assert refused and {r.status_code for r in answers} <= {401, 429}, answers
        assert {r.request.url.path for r in refused} == {"/api/v1/tickets", "/mcp"}
        body = refused[0].json()
        assert (body["error"], body["limit"]) == ("rate_limited", 50)
        assert refused[0].headers["Retry-After"] == "1"
        assert refused[0].headers["RateLimit-Remaining"] == "0"
        # Another address is not refused for it (all of 127/8 is this host).
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=elsewhere, timeout=30) as c:
            other = c.get(base + "/api/v1/tickets?limit=1", headers={"Authorization": "Bearer x"})
        assert other.status_code == 401
        # /metrics is not served through the proxy (every client would be 127.0.0.1).
        assert _status(f"http://127.0.0.1:{proxy.port}/metrics") == 404
