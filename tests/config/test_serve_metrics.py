"""``manage.py serve_metrics``: a worker-only host's exporter, prometheus-client's
WSGI app over this host's multiprocess directory, with the ledger gauges on
request. A real process, a real scrape."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from django.core.management import CommandError, call_command

from tests.conftest import ROOT, _test_env
from tests.nginx import free_port
from tests.waiting import wait_for


def test_it_refuses_to_start_without_a_metrics_directory(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(CommandError, match="PROMETHEUS_MULTIPROC_DIR"):
        call_command("serve_metrics", "--port", str(free_port()))


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_serves_every_process_of_the_host_and_the_ledger(tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {**_test_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    # Two processes of the host count on their own; the scrape adds them up.
    count = "import prometheus_client as p; p.Counter('fh_probe', 'a probe').inc(3)"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", count], env=env, check=True, timeout=60)
    port = free_port()
    log = tmp_path / "serve_metrics.log"
    with log.open("wb") as out:  # the child keeps its own copy
        server = subprocess.Popen(
            [sys.executable, "manage.py", "serve_metrics", "--port", str(port), "--ledger"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def scrape() -> httpx.Response | None:
            if server.poll() is not None:
                raise AssertionError(f"serve_metrics exited: {log.read_text()}")
            try:
                # Plain HTTP, polled: verify=False spares loading the CA
                # bundle into a TLS context at every call.
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, verify=False)
            except httpx.TransportError:
                return None

        answer = wait_for(scrape, timeout=90, message="serve_metrics answering")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain")
        assert "fh_probe_total 6.0" in answer.text
        assert "claimcheck_ledger_scrape_ok 1.0" in answer.text
        assert "claimcheck_open_cases 0.0" in answer.text
    finally:
        server.terminate()
        server.wait(timeout=30)
