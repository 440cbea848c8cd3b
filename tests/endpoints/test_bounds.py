"""The one depth bound (``TICKET_MAX_JSON_DEPTH``, core/inputs.py) where a
value enters, and a turn that always ends in a recorded outcome: an input
past the bound is refused at admission before any runner sees it; a reply
the ledger cannot store fails its ticket ``unstorable_result``; a failure of
the worker's own code while it hands a turn over or finishes it fails the
ticket ``runtime_error``; and the endpoint stays available for its next
ticket every time (quarantine is for a turn whose stop cannot be proven).

In-process against real PostgreSQL, as a worker runs a turn: an isolated
turn forks its process, an http agent is a local server."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from endpoints.models import Endpoint
from recovery.models import RecoveryCase
from runtime import turns as runtime
from tests.endpoints.deep_runners import nest, nest_text
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}
SAME = "tests.endpoints.deep_runners.same"
RUNNERS = {
    "process": {"kind": "python", "path": SAME},
    "inline": {"kind": "python", "path": SAME, "isolation": "inline"},
    "agent": AGENT,
}


def run(ticket_id) -> Ticket:
    runtime.run_ticket(ticket_id=ticket_id)
    return Ticket.objects.get(id=ticket_id)


def serves_on(address: str, input_: dict | None = None) -> None:
    """The endpoint is available, nothing was quarantined, and its next
    ticket runs to success."""
    assert Endpoint.objects.get(address=address).state == "available"
    assert not RecoveryCase.objects.exists()
    nxt = run(admit_ticket(endpoint=address, input=input_ or {"prompt": "hello"}).ticket.id)
    assert nxt.state == "succeeded", nxt.error
    assert Endpoint.objects.get(address=address).state == "available"


# --- Admission ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(RUNNERS))
def test_an_input_past_the_bound_is_400_and_the_endpoint_serves_on(
    api, make_endpoint, settings, kind
):
    make_endpoint("deep", runner=RUNNERS[kind])
    bound = settings.TICKET_MAX_JSON_DEPTH
    for depth in (800, bound + 1):
        resp = api.post("/tickets", {"endpoint": "deep", "input": nest(depth)})
        assert resp.status_code == 400, (depth, resp.status_code)
        body = resp.json()
        assert body["error"] == "invalid" and body["field"] == "input", body
        assert f"nested more than {bound} levels deep" in body["detail"]
        assert "TICKET_MAX_JSON_DEPTH" in body["detail"]
    assert not Ticket.objects.exists()
    serves_on("deep")


@pytest.mark.parametrize("kind", list(RUNNERS))
def test_the_deepest_input_the_api_accepts_runs_and_the_endpoint_serves_on(
    api, make_endpoint, settings, kind
):
    make_endpoint("deep", runner=RUNNERS[kind])
    deepest = nest(settings.TICKET_MAX_JSON_DEPTH)
    resp = api.post("/tickets", {"endpoint": "deep", "input": deepest})
    assert resp.status_code == 201, resp.content
    ticket = run(resp.json()["id"])
    assert ticket.state == "succeeded", ticket.error
    if kind == "agent":
        assert ticket.result.startswith("echo: {")
    else:
        assert ticket.result == deepest  # through the pipe, json and PostgreSQL and back
    serves_on("deep")


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("requester", {"requester": {"metadata": nest(64)}}),
        ("return_to", {"return_to": {"endpoint": "deep", "continuation": nest(64)}}),
    ],
)
def test_every_field_of_an_admission_has_the_bound(api, make_endpoint, field, body):
    make_endpoint("deep")
    resp = api.post("/tickets", {"endpoint": "deep", "input": {}, **body})
    assert resp.status_code == 400 and resp.json()["field"] == field, resp.content


def test_admission_by_the_runtime_has_the_bound_too(make_endpoint):
    from core.inputs import Unstorable

    make_endpoint("deep")
    for kwargs, field in [
        ({"input": nest(65)}, "input"),
        ({"input": {}, "requester": {"metadata": nest(65)}}, "requester.metadata"),
        ({"input": {}, "continuation": nest(65), "return_to": "deep"}, "return_to.continuation"),
    ]:
        with pytest.raises(Unstorable) as info:
            admit_ticket(endpoint="deep", **kwargs)
        assert info.value.extra["field"] == field
    assert not Ticket.objects.exists()


@pytest.mark.parametrize(
    ("kind", "code", "says"),
    [
        ("process", "runtime_error", "RecursionError in the worker while handing the turn"),
        ("inline", "unstorable_result", "result is nested more than 64 levels deep"),
        ("agent", "runtime_error", "RecursionError in the worker while handing the turn"),
    ],
)
def test_an_input_admitted_before_the_bound_fails_its_turn_not_the_endpoint(
    make_endpoint, settings, kind, code, says
):
    """A ticket admitted under a looser bound (before it existed, or while
    an operator had raised it) reaches a worker that cannot carry it: its
    turn fails, recorded, and the endpoint serves on."""
    make_endpoint("deep", runner=RUNNERS[kind])
    settings.TICKET_MAX_JSON_DEPTH = 900
    ticket = admit_ticket(endpoint="deep", input=nest(800)).ticket
    settings.TICKET_MAX_JSON_DEPTH = 64
    ticket = run(ticket.id)
    assert ticket.state == "failed"
    assert ticket.error["code"] == code and says in ticket.error["detail"], ticket.error
    assert ticket.turn.state == "failed"
    serves_on("deep")


# --- What a runner returns -------------------------------------------------------------------

# (case, the reply's text, what the detail says); MARK is in every value.
MARK = "value-mark"
REPLIES = [
    ("nul", '{"result": {"a": "' + MARK + '\\u0000"}}', "result.a contains a NUL character"),
    ("surrogate", '{"result": {"a": "' + MARK + '\\udc00"}}', "result.a contains a lone surrogate"),
    (
        "depth 800",
        '{"result": ' + nest_text(800, MARK) + "}",
        "result is nested more than 64 levels deep",
    ),
    ("NaN", '{"result": {"a": NaN, "b": "' + MARK + '"}}', "result.a is NaN, not a finite number"),
    (
        "json's own limit",
        '{"result": ' + nest_text(5000, MARK) + "}",
        "JSON nested too deeply to read",
    ),
]
GOOD_REPLY = '{"result": {"ok": true}}'


class Agent:
    """A local http agent answering 200 with the text of the reply it is
    given for each turn."""

    def __init__(self) -> None:
        self.replies: list[str] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = agent.replies.pop(0).encode()
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
def agent(settings):
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    a = Agent()
    yield a
    a.close()


def assert_unstorable(ticket: Ticket, says: str, reply: str) -> None:
    assert ticket.state == "failed", ticket.state
    assert ticket.error["code"] == "unstorable_result", ticket.error
    assert says in ticket.error["detail"], ticket.error
    assert ticket.result is None
    assert MARK not in json.dumps(ticket.error)  # what was wrong, never the value


@pytest.mark.parametrize(("reply", "says"), [r[1:] for r in REPLIES], ids=[r[0] for r in REPLIES])
def test_an_http_agents_reply_the_ledger_cannot_store_fails_its_ticket(agent, reply, says):
    from endpoints.services import create_endpoint

    create_endpoint(address="http", runner={"kind": "http", "url": f"{agent.url}/turn"})
    agent.replies = [reply, GOOD_REPLY]
    ticket = run(admit_ticket(endpoint="http", input={"n": 1}).ticket.id)
    assert_unstorable(ticket, says, reply)
    serves_on("http")
    assert Ticket.objects.filter(state="succeeded").get().result == {"ok": True}


# The command prints the reply its input carries (as text: storable there).
PRINT_REPLY = (
    "import json, sys; "
    "sys.stdout.write(json.load(sys.stdin)['ticket']['input'].get('reply', '{\"result\": 1}'))"
)


@pytest.mark.parametrize(("reply", "says"), [r[1:] for r in REPLIES], ids=[r[0] for r in REPLIES])
def test_a_commands_stdout_the_ledger_cannot_store_fails_its_ticket(make_endpoint, reply, says):
    make_endpoint("cmd", runner={"kind": "command", "argv": [sys.executable, "-c", PRINT_REPLY]})
    ticket = run(admit_ticket(endpoint="cmd", input={"reply": reply}).ticket.id)
    assert_unstorable(ticket, says, reply)
    serves_on("cmd", {"reply": GOOD_REPLY})


@pytest.mark.parametrize("isolation", ["process", "inline"])
@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("nul", "result.a contains a NUL character"),
        ("surrogate", "result.a contains a lone surrogate"),
        ("deep", "result is nested more than 64 levels deep"),
        ("set", "result.a is a set, not a JSON value"),
    ],
)
def test_a_python_runners_result_the_ledger_cannot_store_fails_its_ticket(
    make_endpoint, isolation, kind, says
):
    make_endpoint("py", path="tests.endpoints.deep_runners.unstorable", isolation=isolation)
    ticket = run(admit_ticket(endpoint="py", input={"kind": kind}).ticket.id)
    assert ticket.state == "failed"
    assert ticket.error["code"] == "unstorable_result", ticket.error
    assert says in ticket.error["detail"], ticket.error
    serves_on("py", {"kind": "fine"})


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_crash_while_finishing_fails_the_turn_runtime_error(make_endpoint, isolation):
    make_endpoint("py", path="tests.endpoints.deep_runners.unstorable", isolation=isolation)
    ticket = run(admit_ticket(endpoint="py", input={"kind": "mixed_keys"}).ticket.id)
    assert ticket.state == "failed"
    assert ticket.error == {
        "code": "runtime_error",
        "detail": "TypeError in the worker while finishing the turn",
    }
    assert ticket.turn.state == "failed"
    serves_on("py", {"kind": "fine"})
