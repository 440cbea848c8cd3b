"""Structured logs, Prometheus metrics and W3C trace propagation, end to end
through a real worker: a local http agent and a local webhook receiver
(tests/tickets/test_delivery.Receiver) stand in for what is off the machine."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from core import logs, tracing
from tests.conftest import wait_for
from tests.tickets.test_delivery import SECRET, Receiver
from tickets.models import Ticket

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
SECRET_INPUT = "pelican-4711-input-never-logged"
SECRET_RESULT = "heron-0815-result-never-logged"


class Agent:
    """A local http agent: records each request's headers and envelope and
    answers 200 with a result."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict]] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                agent.requests.append((dict(self.headers.items()), body))
                reply = json.dumps({"result": {"answer": SECRET_RESULT}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/agent"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the series ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
    return total


# --- In-process: headers, access, malformed input --------------------------------------------


@pytest.mark.django_db
def test_request_id_is_echoed_or_made_and_a_bad_traceparent_is_ignored(api, make_endpoint):
    make_endpoint("obs.echo")
    resp = api.post(
        "/tickets",
        {"endpoint": "obs.echo", "input": {"n": 1}},
        headers={"HTTP_X_REQUEST_ID": "req-abc.123", "HTTP_TRACEPARENT": "00-zzzz-nope-01"},
    )
    assert resp.status_code == 201, resp.content
    assert resp["X-Request-ID"] == "req-abc.123"
    ticket = resp.json()
    # Malformed: ignored, the ticket starts its own trace, returned as traceparent.
    assert ticket["trace_id"] != "zzzz"
    assert resp["traceparent"].split("-")[1] == tracing.w3c_trace_id(ticket["trace_id"])
    bad_id = api.get("/tickets", headers={"HTTP_X_REQUEST_ID": "x" * 500 + "\n"})
    assert re.fullmatch(r"[0-9a-f]{32}", bad_id["X-Request-ID"])


@pytest.mark.django_db
def test_traceparent_sets_a_root_tickets_trace_unless_the_body_names_one(api, make_endpoint):
    make_endpoint("obs.echo")
    resp = api.post(
        "/tickets",
        {"endpoint": "obs.echo", "input": {"n": 2}},
        headers={"HTTP_TRACEPARENT": TRACEPARENT},
    )
    assert resp.status_code == 201 and resp.json()["trace_id"] == TRACE
    assert resp["traceparent"].startswith(f"00-{TRACE}-")
    assert not resp["traceparent"].endswith("00f067aa0ba902b7-01")  # our own span id
    given = api.post(
        "/tickets",
        {"endpoint": "obs.echo", "input": {"n": 3}, "trace_id": "my-trace"},
        headers={"HTTP_TRACEPARENT": TRACEPARENT},
    )
    assert given.json()["trace_id"] == "my-trace"
    assert given["traceparent"].split("-")[1] == tracing.w3c_trace_id("my-trace")


def test_traceparent_parsing():
    assert tracing.parse_traceparent(TRACEPARENT).trace_id == TRACE
    for bad in [
        "",
        "garbage",
        f"ff-{TRACE}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE.upper()}x-00f067aa0ba902b7-01",
    ]:
        assert tracing.parse_traceparent(bad) is None, bad
    assert tracing.w3c_trace_id(TRACE) == TRACE
    assert re.fullmatch(r"[0-9a-f]{32}", tracing.w3c_trace_id("not hex"))


@pytest.mark.django_db
def test_metrics_access_is_bound_by_the_settings(client, api, make_endpoint):
    make_endpoint("obs.echo")
    api.post("/tickets", {"endpoint": "obs.echo", "input": {"n": 1}, "dedupe_key": "k"})
    api.post("/tickets", {"endpoint": "obs.echo", "input": {"n": 1}, "dedupe_key": "k"})
    api.post("/tickets", {"endpoint": "obs.nope", "input": {"n": 1}})
    resp = client.get("/metrics")  # the test client is 127.0.0.1: allowed by default
    assert resp.status_code == 200
    text = resp.content.decode()
    for outcome, reason in [("admitted", ""), ("duplicate", ""), ("refused", "not_found")]:
        assert sample(text, "claimcheck_admissions_total", outcome=outcome, reason=reason) >= 1
    assert sample(text, "claimcheck_queued_tickets", endpoint="obs.echo") == 1
    assert "claimcheck_ledger_scrape_ok 1.0" in text
    assert sample(text, "claimcheck_busy_slots", endpoint="obs.echo") == 0
    for gauge in ("claimcheck_quarantined_endpoints", "claimcheck_open_cases"):
        assert re.search(rf"^{gauge} 0\.0$", text, re.M), gauge
    with override_settings(METRICS_ALLOWED_IPS=["10.0.0.0/8"], METRICS_BEARER_TOKEN="tok-1"):
        assert client.get("/metrics").status_code == 404
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer tok-1").status_code == 200
        assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    with override_settings(METRICS_ALLOWED_IPS=[], METRICS_BEARER_TOKEN=""):
        assert client.get("/metrics").status_code == 404


def test_routine_sweep_lines_are_debug_and_secrets_are_masked(caplog):
    import logging

    record = logging.LogRecord(
        "celery.app.trace",
        logging.INFO,
        "",
        0,
        "Task %(name)s[%(id)s] succeeded",
        {"name": "runtime.sweep_budgets", "id": "x"},
        None,
    )
    assert logs.RoutineFilter().filter(record) is False and record.levelno == logging.DEBUG
    turn = logging.LogRecord(
        "celery.app.trace",
        logging.INFO,
        "",
        0,
        "Task %(name)s[%(id)s] succeeded",
        {"name": "runtime.run_ticket", "id": "x"},
        None,
    )
    assert logs.RoutineFilter().filter(turn) is True and turn.levelno == logging.INFO
    leaky = logging.LogRecord("x", logging.INFO, "", 0, "sent %s", ("Bearer abc.def",), None)
    logs.RedactFilter().filter(leaky)
    assert "abc.def" not in leaky.getMessage()


# --- A real worker -------------------------------------------------------------------------------


@pytest.fixture
def observed_worker(monkeypatch, celery_procs, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    monkeypatch.setenv("LOG_FORMAT", "json")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    monkeypatch.setenv("DELIVERY_ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setenv("DELIVERY_SIGNING_SECRET", SECRET)
    celery_procs.worker()
    celery_procs.beat()
    celery_procs.metrics_dir = metrics_dir
    return celery_procs


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_logs_json_counts_and_carries_the_trace(api, make_endpoint, observed_worker):
    agent, hook = Agent(), Receiver()
    try:
        with override_settings(
            DELIVERY_ALLOWED_HOSTS=["127.0.0.1"], DELIVERY_SIGNING_SECRET=SECRET
        ):
            make_endpoint("obs.agent", runner={"kind": "http", "url": agent.url})
            resp = api.post(
                "/tickets",
                {
                    "endpoint": "obs.agent",
                    "input": {"secret": SECRET_INPUT},
                    "requester": {"name": "t", "webhook_url": hook.url},
                },
                headers={"HTTP_TRACEPARENT": TRACEPARENT},
            )
        assert resp.status_code == 201, resp.content
        ticket_id = resp.json()["id"]
        assert resp["traceparent"].startswith(f"00-{TRACE}-")

        def delivered():
            t = Ticket.objects.get(id=ticket_id)
            return t if t.delivery_state == "delivered" else None

        wait_for(delivered, timeout=60, message="the webhook delivery")
        ticket = Ticket.objects.get(id=ticket_id)
        assert ticket.trace_id == TRACE and ticket.state == "succeeded"

        # The trace reached the agent (header and envelope) and the receiver.
        headers, envelope = agent.requests[0]
        assert headers["traceparent"].split("-")[1] == TRACE
        assert envelope["trace"]["trace_id"] == TRACE
        assert envelope["trace"]["traceparent"].split("-")[1] == TRACE
        assert len(hook.requests) == 1
        assert hook.requests[0][0]["traceparent"].split("-")[1] == TRACE

        # Logs: JSON lines; those about the turn carry its ids; no input,
        # result, turn token or signing secret anywhere.
        raw = observed_worker.log("turns").decode(errors="replace")
        token = envelope["turn"]["token"]
        for needle in (SECRET_INPUT, SECRET_RESULT, token, SECRET.removeprefix("whsec_")):
            assert needle not in raw, needle
        records = []
        for line in raw.splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        assert records, raw[-2000:]
        turn_lines = [r for r in records if r.get("turn_id") == str(ticket.turn_id)]
        assert turn_lines, raw[-3000:]
        for r in turn_lines:
            assert r["ticket_id"] == ticket_id and r["trace_id"] == TRACE
            assert r["endpoint"] == "obs.agent" and r["seq"] == 1
            assert {"time", "level", "logger", "message"} <= r.keys()
        finished = [r for r in turn_lines if "finished" in r["message"]]
        assert finished, turn_lines
        delivery_lines = [r for r in records if r.get("delivery_id")]
        assert any(
            r.get("ticket_id") == ticket_id and r.get("trace_id") == TRACE for r in delivery_lines
        ), delivery_lines
        # Routine sweeps (beat runs them every 0.5 s) say nothing at INFO.
        assert not [r for r in records if "sweep_" in r["message"] and r["level"] == "INFO"]

        # Metrics from the worker's processes (the multiprocess directory).
        def text() -> str:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=str(observed_worker.metrics_dir))
            return generate_latest(registry).decode()

        wait_for(
            lambda: (
                sample(text(), "claimcheck_delivery_attempts_total", status="2xx") >= 1
                and sample(text(), "claimcheck_sweep_duration_seconds_count", sweep="budgets") >= 1
            ),
            timeout=60,
            message="the delivery attempt and a budgets sweep counted",
        )
        out = text()
        assert sample(out, "claimcheck_turns_started_total") >= 1
        assert sample(out, "claimcheck_turns_total", outcome="succeeded") >= 1
        assert sample(out, "claimcheck_turn_duration_seconds_count", outcome="succeeded") >= 1
        assert sample(out, "claimcheck_queue_wait_seconds_count") >= 1
        assert sample(out, "claimcheck_sweep_duration_seconds_count", sweep="budgets") >= 1
        assert sample(out, "claimcheck_sweep_runs_total", sweep="budgets", result="idle") >= 1
    finally:
        agent.close()
        hook.close()


@pytest.mark.django_db
def test_web_log_lines_are_json_with_the_request_id(client):
    import io
    import logging

    from pythonjsonlogger.json import JsonFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(logs.ContextFilter())
    handler.addFilter(logs.RedactFilter())
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        client.get(
            "/api/v1/no-such-route",
            HTTP_X_REQUEST_ID="req-web-1",
            HTTP_TRACEPARENT=TRACEPARENT,
            HTTP_AUTHORIZATION="Bearer sekrit-key-123",
        )
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines, "django.request logs a 404"
    for line in lines:
        assert line["request_id"] == "req-web-1" and line["trace_id"] == TRACE
    assert "sekrit-key-123" not in stream.getvalue()
    assert logs.current() == {}  # nothing leaks past the request
