"""Runner configuration holds no secrets (API.md "Runner details are for
owners and staff"): each runner kind takes its own fields only, credentials
only as named secrets (core/secrets.py) resolved on the worker when the
turn runs, never stored, logged or shown; and the runner's settings and
submitter lists are shown to the endpoint's owners and staff only."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command

from accounts.keys import create_api_key
from endpoints.models import Endpoint
from endpoints.services import create_endpoint
from runtime import turns as runtime
from tests.recovery.conftest import dump_ledger
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db

ECHO = {"kind": "python", "path": "runtime.demo.echo"}
AGENT_SECRET = "AGENT-SECRET-4c1f9e"
API_KEY = "AGENTKEY-77a0d2"


# --- The schema ------------------------------------------------------------------------------

REFUSED = [
    # (runner, what the 400 names)
    ({**ECHO, "api_key": API_KEY}, "api_key"),
    ({"kind": ["http"], "url": "https://agent.example/t"}, "kind"),
    ({**ECHO, "argv": ["x"]}, "argv"),
    ({"kind": "command", "argv": ["/usr/bin/true"], "url": "http://x"}, "url"),
    ({"kind": "http", "url": f"https://agent.example/turn?api_key={API_KEY}"}, "api_key="),
    ({"kind": "http", "url": f"https://agent.example/turn?x=1&token={API_KEY}"}, "token="),
    ({"kind": "http", "url": f"https://bot:{API_KEY}@agent.example/turn"}, "user information"),
    (
        {
            "kind": "http",
            "url": "https://agent.example/turn",
            "cancel_url": f"https://a.example/c?sig={API_KEY}",
        },
        "cancel_url",
    ),
    (
        {
            "kind": "http",
            "url": "https://agent.example/t",
            "headers": {"Authorization": f"Bearer {AGENT_SECRET}"},
        },
        "headers.Authorization",
    ),
    (
        {"kind": "http", "url": "https://agent.example/t", "headers": {"X-Api-Key": API_KEY}},
        "headers.X-Api-Key",
    ),
    (
        {
            "kind": "http",
            "url": "https://agent.example/t",
            "headers": {"X-Upstream": f"Basic {API_KEY}"},
        },
        "headers.X-Upstream",
    ),
    (
        {"kind": "http", "url": "https://agent.example/t", "headers": {"Host": "elsewhere"}},
        "headers.Host",
    ),
    ({"kind": "http", "url": "https://agent.example/t", "auth": {"secret": "lower"}}, "auth"),
    ({"kind": "http", "url": "https://agent.example/t", "auth": AGENT_SECRET}, "auth"),
    (
        {
            "kind": "http",
            "url": "https://agent.example/t",
            "auth": {"secret": "A", "value": AGENT_SECRET},
        },
        "auth",
    ),
    (
        {
            "kind": "http",
            "url": "https://agent.example/t",
            "auth": {"secret": "A"},
            "headers": {"Authorization": {"secret": "B"}},
        },
        "Authorization",
    ),
    ({"kind": "http", "url": "https://agent.example/t", "timeout_s": "30"}, "timeout_s"),
    ({"kind": "command", "argv": ["/usr/bin/true", f"--api-token={API_KEY}"]}, "argv[1]"),
    # The outbound policy applies to an agent's URL: 6to4 of loopback.
    ({"kind": "http", "url": "http://[2002:7f00:1::]/turn"}, "not a public address"),
]


@pytest.mark.parametrize(("runner", "named"), REFUSED)
def test_a_runner_outside_its_kinds_schema_is_400_naming_the_field(api, settings, runner, named):
    settings.DELIVERY_ALLOWED_HOSTS = []
    settings.RUNNER_COMMAND_ALLOWED = ["/usr/bin/true"]
    resp = api.post("/endpoints", {"address": "x", "runner": runner})
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["error"] == "invalid" and named in body["detail"], body
    # A refusal never repeats a credential it refused.
    assert AGENT_SECRET not in resp.content.decode() and API_KEY not in resp.content.decode()
    assert not Endpoint.objects.filter(address="x").exists()
    # The same on a change of runner.
    create_endpoint(address="y", runner=ECHO)
    assert api.patch("/endpoints/y", {"runner": runner}).status_code == 400


def test_credentials_by_name_are_accepted(api, settings):
    settings.DELIVERY_ALLOWED_HOSTS = ["agent.example"]
    runner = {
        "kind": "http",
        "url": "https://agent.example/turn?mode=fast",
        "cancel_url": "https://agent.example/cancel",
        "timeout_s": 20,
        "auth": {"secret": "RESEARCH_AGENT_TOKEN"},
        "headers": {"Accept": "application/json", "X-Api-Key": {"secret": "AGENT_API_KEY"}},
    }
    resp = api.post("/endpoints", {"address": "named", "runner": runner})
    assert resp.status_code == 201, resp.content
    assert resp.json()["runner"] == runner  # names only: nothing to hide from staff


# --- Resolved on the worker, never kept ----------------------------------------------------------


class EchoingAgent:
    """A local agent that records the headers it got and, to prove the
    ledger is scrubbed, puts them in its reply."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got = {k.lower(): v for k, v in self.headers.items()}
                agent.headers.append(got)
                body = json.dumps({"result": {"saw": got}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def agent(settings, tmp_path):
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    secrets_file = tmp_path / "runner-secrets"
    secrets_file.write_text(f"RESEARCH_AGENT_TOKEN={AGENT_SECRET}\nAGENT_API_KEY={API_KEY}\n")
    settings.RUNNER_SECRETS_FILE = str(secrets_file)
    a = EchoingAgent()
    yield a
    a.close()


def test_named_secrets_are_sent_resolved_and_kept_nowhere(agent, caplog):
    create_endpoint(
        address="research",
        runner={
            "kind": "http",
            "url": f"{agent.url}/turn",
            "auth": {"secret": "RESEARCH_AGENT_TOKEN"},
            "headers": {"X-Api-Key": {"secret": "AGENT_API_KEY"}, "X-Team": "research"},
        },
    )
    ticket = admit_ticket(endpoint="research", input={"q": 1}).ticket
    with caplog.at_level("DEBUG"):
        runtime.run_ticket(ticket_id=ticket.id)
    sent = agent.headers[0]
    assert sent["authorization"] == f"Bearer {AGENT_SECRET}"
    assert sent["x-api-key"] == API_KEY and sent["x-team"] == "research"
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "succeeded", ticket.error
    # The agent echoed them back: the ledger has the names instead.
    assert ticket.result["saw"]["authorization"] == "Bearer [secret RESEARCH_AGENT_TOKEN]"
    assert ticket.result["saw"]["x-api-key"] == "[secret AGENT_API_KEY]"
    ledger = json.dumps(dump_ledger(exclude=()), default=str)
    for value in (AGENT_SECRET, API_KEY):
        assert value not in ledger
        assert value not in caplog.text


def test_the_cancel_request_carries_the_same_credentials(agent):
    import uuid

    from runtime import runners

    runner = {
        "kind": "http",
        "url": f"{agent.url}/turn",
        "cancel_url": f"{agent.url}/cancel",
        "auth": {"secret": "RESEARCH_AGENT_TOKEN"},
    }
    runners.cancel_http_turn(runner, uuid.uuid4(), 3)
    assert agent.headers[0]["authorization"] == f"Bearer {AGENT_SECRET}"


def test_a_secret_the_host_lacks_fails_the_turn_naming_it(agent):
    create_endpoint(
        address="nosecret",
        runner={"kind": "http", "url": f"{agent.url}/turn", "auth": {"secret": "NOT_HELD"}},
    )
    ticket = admit_ticket(endpoint="nosecret", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "failed" and ticket.error["code"] == "secret_missing"
    assert "NOT_HELD" in ticket.error["detail"]
    assert agent.headers == []  # nothing sent without its credential


# --- Rows stored before the schema --------------------------------------------------------------


def test_a_stored_runner_outside_the_schema_is_listed_and_not_run(agent):
    create_endpoint(address="legacy", runner={"kind": "http", "url": f"{agent.url}/turn"})
    # A row written before the schema existed (no service would write it now).
    legacy = {
        "kind": "http",
        "url": f"{agent.url}/turn?api_key={API_KEY}",
        "headers": {"Authorization": f"Bearer {AGENT_SECRET}"},
    }
    Endpoint.objects.filter(address="legacy").update(runner=legacy)
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 runner record"):
        call_command("check_runners", stdout=out)
    assert "endpoint legacy:" in out.getvalue() and "api_key=" in out.getvalue()
    assert API_KEY not in out.getvalue() and AGENT_SECRET not in out.getvalue()

    ticket = admit_ticket(endpoint="legacy", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "failed" and ticket.error["code"] == "runner_invalid"
    assert agent.headers == []


def test_check_runners_passes_when_every_runner_fits():
    create_endpoint(address="fine", runner=ECHO)
    out = io.StringIO()
    call_command("check_runners", stdout=out)
    assert "every runner fits" in out.getvalue()


# --- Who sees the configuration -------------------------------------------------------------


def test_runner_settings_and_submitters_are_for_owners_and_staff(api, django_user_model, client):
    for name in ("olive", "sam", "stranger"):
        django_user_model.objects.create_user(name)
    runner = {
        "kind": "http",
        "url": "http://127.0.0.1:9/turn",
        "auth": {"secret": "RESEARCH_AGENT_TOKEN"},
    }
    from django.test import override_settings

    with override_settings(DELIVERY_ALLOWED_HOSTS=["127.0.0.1"]):
        create_endpoint(
            address="hidden", runner=runner, owners=["olive"], submitters={"users": ["sam"]}
        )
    for name, full in (("olive", True), ("sam", False), ("stranger", False)):
        key = create_api_key(username=name)[1]
        one = api.as_key(key).get("/endpoints/hidden").json()
        listed = next(
            e for e in api.as_key(key).get("/endpoints").json() if e["address"] == "hidden"
        )
        for body in (one, listed):
            if full:
                assert body["runner"] == runner
                assert body["submitters"] == {"users": ["sam"], "groups": []}
            else:
                assert body["runner"] == {"kind": "http"}, name
                assert "submitters" not in body, name
                assert "RESEARCH_AGENT_TOKEN" not in json.dumps(body)
            assert body["state"] == "available" and body["turn_budget_s"] > 0
            assert {"busy_policy", "requires_approval", "interrupt_grace_s"} <= set(body)
    staff = api.get("/endpoints/hidden").json()
    assert staff["runner"] == runner and staff["submitters"]["users"] == ["sam"]
