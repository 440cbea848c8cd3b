"""A ticket stream on the production web tier: gunicorn's gthread workers
(deploy/gunicorn.conf.py, one process of two threads) behind nginx as
deployed (deploy/nginx.conf), which buffers other answers. Each message
passes at once, and a process holds no more streams than its wait slots:
the next is 429 while its other thread keeps serving."""

from __future__ import annotations

import contextlib
import os
import signal
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
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not nginx.available(), reason="nginx needed (make test installs it)"),
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def web(tmp_path):
    port = nginx.free_port()
    env = {
        **_test_env(),
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
        "GUNICORN_THREADS": "2",
        "API_WAIT_SLOTS": "1",  # one thread for streams, one for the rest
        "RATE_LIMIT_CONCURRENT_STREAMS": "0",
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


def _status(url: str, **kw) -> int | None:
    try:
        # Plain HTTP, polled: verify=False spares loading the CA bundle into
        # a TLS context at every call (most of a poll's CPU).
        return httpx.get(url, timeout=5, verify=False, **kw).status_code
    except httpx.HTTPError:
        return None


def test_a_stream_passes_nginx_unbuffered_and_holds_one_slot(web, tmp_path, api_key, make_endpoint):
    make_endpoint("nginx.echo")  # no worker: queued until cancelled
    auth = {"Authorization": f"Bearer {api_key}"}
    with (
        nginx.Nginx(upstream=web, directory=tmp_path / "nginx") as proxy,
        httpx.Client(
            base_url=f"http://127.0.0.1:{proxy.port}/api/v1", headers=auth, timeout=30
        ) as http,
    ):
        ticket = http.post("/tickets", json={"endpoint": "nginx.echo", "input": {}}).json()["id"]
        other = http.post("/tickets", json={"endpoint": "nginx.echo", "input": {"n": 2}}).json()
        kinds: list[str] = []
        first = threading.Event()

        def read() -> None:
            with http.stream("GET", f"/tickets/{ticket}/stream") as answer:
                assert answer.headers["content-type"].startswith("text/event-stream")
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        kinds.append(line.removeprefix("event: "))
                        first.set()

        reader = threading.Thread(target=read)
        reader.start()
        # The first event arrives while the stream is open: nginx did not
        # hold it back for a buffer to fill or the answer to end.
        assert first.wait(20), "no event through nginx while the stream is open"
        assert kinds == ["admitted"]

        # The process's one stream slot is taken: the next stream is 429 at
        # once, and the other thread still serves.
        refused = http.get(f"/tickets/{other['id']}/stream")
        assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
        assert "API_WAIT_SLOTS" in refused.json()["detail"]
        assert http.get(f"/tickets/{ticket}").status_code == 200

        assert http.post(f"/tickets/{ticket}/cancel").status_code == 200
        reader.join(timeout=20)
        assert not reader.is_alive()
    assert kinds == ["admitted", "cancelled", "end"]
