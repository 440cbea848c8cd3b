"""Runners a staff key may set come from the operator's allow-list (issue 9
finding 8), and every change of who or what runs for an endpoint is an
append-only EndpointEvent."""

from __future__ import annotations

import io

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from console.owners import create_owner
from core.errors import Invalid
from endpoints.models import Endpoint, EndpointEvent
from endpoints.services import create_endpoint, update_endpoint
from runtime import turns as runtime
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db

ECHO = {"kind": "python", "path": "runtime.demo.echo"}


@pytest.fixture
def demo_only(settings):
    """The shipped defaults: the demo runners, no commands."""
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["runtime.demo."]
    settings.RUNNER_COMMAND_ALLOWED = []
    settings.DELIVERY_ALLOWED_HOSTS = []


@pytest.mark.parametrize(
    "runner",
    [
        {"kind": "python", "path": "os.system"},
        {"kind": "python", "path": "subprocess.check_output"},
        {"kind": "python", "path": "runtime.demonic.echo"},  # a prefix, not a package
        {"kind": "python", "path": "tests.conftest.wait_for"},
        {"kind": "command", "argv": ["/bin/sh", "-c", "id"]},
        {"kind": "command", "argv": ["python3", "-c", "print(1)"]},
        {"kind": "http", "url": "http://127.0.0.1:8000/agent"},
        {"kind": "http", "url": "http://169.254.169.254/latest/meta-data/"},
        {"kind": "http", "url": "https://93.184.215.14/", "cancel_url": "http://10.0.0.1/x"},
    ],
)
def test_a_runner_outside_the_allow_list_is_400_naming_it(api, demo_only, runner):
    resp = api.post("/endpoints", {"address": "evil", "runner": runner})
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["error"] == "invalid"
    named = runner.get("path") or (runner.get("argv") or [""])[0] or ""
    if runner["kind"] == "http":
        assert "http runner" in body["detail"]
    else:
        assert repr(named) in body["detail"], body["detail"]
    assert not Endpoint.objects.filter(address="evil").exists()
    assert not EndpointEvent.objects.exists()


def test_a_patch_to_a_refused_runner_changes_nothing(api, demo_only):
    assert api.post("/endpoints", {"address": "ok", "runner": ECHO}).status_code == 201
    events = EndpointEvent.objects.count()
    resp = api.patch("/endpoints/ok", {"runner": {"kind": "python", "path": "os.system"}})
    assert resp.status_code == 400 and resp.json()["error"] == "invalid"
    assert Endpoint.objects.get(address="ok").runner == ECHO
    assert EndpointEvent.objects.count() == events


def test_what_the_allow_list_admits(settings, demo_only):
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["runtime.demo", "tests.agents."]
    settings.RUNNER_COMMAND_ALLOWED = ["/usr/bin/true"]
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    create_endpoint(address="a", runner={"kind": "python", "path": "runtime.demo.echo"})
    create_endpoint(address="b", runner={"kind": "python", "path": "tests.agents.any.thing"})
    create_endpoint(address="c", runner={"kind": "command", "argv": ["/usr/bin/true", "-x"]})
    create_endpoint(address="d", runner={"kind": "http", "url": "http://127.0.0.1:9/turn"})
    for refused in (
        {"kind": "command", "argv": ["true"]},  # the executable exactly as listed, no PATH
        {"kind": "command", "argv": ["/usr/bin/../bin/true"]},
        {"kind": "python", "path": "tests.agentsx.run"},
    ):
        with pytest.raises(Invalid):
            create_endpoint(address="e", runner=refused)


def test_commands_obey_the_allow_list_too(settings):
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["somewhere.else."]
    with pytest.raises(Invalid, match="RUNNER_PYTHON_ALLOWED_PREFIXES"):
        call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    assert not Endpoint.objects.exists()


def test_a_turn_whose_runner_the_operator_no_longer_allows_fails_without_running(settings):
    create_endpoint(address="old", runner=ECHO)
    ticket = admit_ticket(endpoint="old", input={"x": 1}).ticket
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["somewhere.else."]
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "failed"
    assert ticket.error["code"] == "runner_not_allowed"
    assert ticket.result is None  # echo never ran


class Agent:
    """A local http agent that records every request it gets."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.paths: list[str] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                agent.paths.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"result": {"ok": true}}'
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
def local_agent():
    agent = Agent()
    yield agent
    agent.close()


def test_an_http_runner_is_checked_again_when_it_sends(settings, local_agent):
    """The agent URL passed the policy when the endpoint was set; at send
    time it no longer does (the operator unlisted the host; or DNS now
    answers an internal address): the turn fails at once, nothing is sent."""
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    create_endpoint(address="agent", runner={"kind": "http", "url": f"{local_agent.url}/turn"})
    first = admit_ticket(endpoint="agent", input={"n": 1}).ticket
    runtime.run_ticket(ticket_id=first.id)
    assert Ticket.objects.get(id=first.id).state == "succeeded"  # listed: sent
    assert local_agent.paths == ["/turn"]

    settings.DELIVERY_ALLOWED_HOSTS = []
    second = admit_ticket(endpoint="agent", input={"n": 2}).ticket
    runtime.run_ticket(ticket_id=second.id)
    second = Ticket.objects.get(id=second.id)
    assert second.state == "failed"
    assert second.error["code"] == "agent_url_refused"
    assert (
        "127.0.0.1" in second.error["detail"] and "not a public address" in second.error["detail"]
    )
    assert local_agent.paths == ["/turn"]  # nothing reached the agent


# --- EndpointEvent -------------------------------------------------------------------------


def kinds(address: str) -> list[str]:
    return list(
        EndpointEvent.objects.filter(endpoint__address=address)
        .order_by("id")
        .values_list("kind", flat=True)
    )


def test_create_and_every_runner_owner_and_submitter_change_is_an_event(api, django_user_model):
    for name in ("olive", "sam"):
        django_user_model.objects.create_user(name)
    resp = api.post("/endpoints", {"address": "ev", "runner": ECHO, "owners": ["olive"]})
    assert resp.status_code == 201
    created = EndpointEvent.objects.get(endpoint__address="ev")
    assert (created.kind, created.actor) == ("created", "user:staff")
    assert created.detail["runner"] == ECHO and created.detail["owners"] == ["olive"]
    assert created.detail["submitters"] is None

    sleep = {"kind": "python", "path": "runtime.demo.sleep"}
    assert api.patch("/endpoints/ev", {"runner": sleep}).status_code == 200
    assert api.patch("/endpoints/ev", {"owners": ["olive", "sam"]}).status_code == 200
    resp = api.patch("/endpoints/ev", {"submitters": {"users": ["sam"]}})
    assert resp.status_code == 200
    assert resp.json()["submitters"] == {"users": ["sam"], "groups": []}
    assert api.patch("/endpoints/ev", {"submitters": None}).json()["submitters"] is None
    assert api.patch("/endpoints/ev", {"turn_budget_s": 42}).status_code == 200
    # The same values again record nothing.
    same = api.patch("/endpoints/ev", {"runner": sleep, "owners": ["olive", "sam"]})
    assert same.status_code == 200
    assert kinds("ev") == [
        "created",
        "runner_changed",
        "owners_changed",
        "submitters_changed",
        "submitters_changed",
        "settings_changed",
    ]
    runner_changed = EndpointEvent.objects.get(endpoint__address="ev", kind="runner_changed")
    assert runner_changed.detail == {"from": ECHO, "to": sleep}
    assert runner_changed.actor == "user:staff"
    owners = EndpointEvent.objects.get(endpoint__address="ev", kind="owners_changed")
    assert owners.detail == {"from": ["olive"], "to": ["olive", "sam"]}
    budget = EndpointEvent.objects.get(endpoint__address="ev", kind="settings_changed")
    assert budget.detail == {"turn_budget_s": {"from": 300.0, "to": 42.0}}


def test_the_owner_command_records_an_owners_change(db):
    create_endpoint(address="cmd", runner=ECHO, actor="test")
    create_owner(username="olive", password="pw-olive-1", endpoints=["cmd"])
    event = EndpointEvent.objects.filter(endpoint__address="cmd").last()
    assert event.kind == "owners_changed"
    assert event.detail == {"from": [], "to": ["olive"]}
    assert event.actor.startswith("command:create_owner")


def test_unknown_submitters_are_400_and_change_nothing(api):
    api.post("/endpoints", {"address": "sub", "runner": ECHO})
    resp = api.patch("/endpoints/sub", {"submitters": {"users": ["ghost"], "groups": ["nope"]}})
    assert resp.status_code == 400
    assert "user ghost" in resp.json()["detail"] and "group nope" in resp.json()["detail"]
    assert Endpoint.objects.get(address="sub").submit_restricted is False
    assert kinds("sub") == ["created"]


@pytest.mark.django_db(transaction=True)  # the owner's statements run on their own connection
def test_the_database_refuses_to_rewrite_endpoint_events(owner_cursor):
    endpoint = create_endpoint(address="ao", runner=ECHO, actor="test")
    update_endpoint(address="ao", changes={"turn_budget_s": 5}, actor="test")
    event = EndpointEvent.objects.filter(endpoint=endpoint).first()
    for statement in (
        "UPDATE endpoints_endpointevent SET actor = 'forged' WHERE id = %s",
        "DELETE FROM endpoints_endpointevent WHERE id = %s",
    ):
        # The application role (this process, under `make test`) is refused by
        # its privileges or, with one role, by the trigger...
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, [event.id])
        # ... and the owner of the table by the trigger itself.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            owner_cursor.execute(statement, [event.id])
    assert EndpointEvent.objects.get(id=event.id).actor == "test"
