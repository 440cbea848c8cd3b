"""The turn API accepts only the credential issued to that exact turn
(API.md "Who may see and do what"; issue 9 finding 1). The token goes to the
runner in the envelope; the ledger keeps only its SHA-256, and the token
never reaches the ledger or the logs."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from endpoints.services import create_endpoint
from runtime import turns as runtime
from tests.recovery.conftest import dump_ledger
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn

pytestmark = pytest.mark.django_db

ECHO = {"kind": "python", "path": "runtime.demo.echo"}


def started(address: str, runner=None, **kw) -> runtime.Started:
    create_endpoint(address=address, runner=runner or ECHO, **kw)
    ticket = admit_ticket(endpoint=address, input={"q": address}).ticket
    turn = runtime.start_turn(ticket_id=ticket.id)
    assert turn is not None
    return turn


def ledger_text() -> str:
    return json.dumps(dump_ledger(exclude=()), default=str)


def test_the_turn_keeps_only_the_sha256_of_its_token():
    s = started("tok")
    assert len(s.token) >= 40
    turn = Turn.objects.get(id=s.turn.id)
    assert turn.token_sha256 == hashlib.sha256(s.token.encode()).hexdigest()
    assert s.token not in ledger_text()
    assert s.token not in repr(s)
    # Each turn gets its own.
    other = started("tok2")
    assert other.token != s.token and other.turn.token_sha256 != turn.token_sha256


def call(api, bearer, path, body=None):
    return api.as_key(bearer).post(path, body)


def test_only_the_exact_turns_token_answers_it(api, client):
    a, b = started("alpha"), started("beta")
    path = f"/turns/{a.turn.id}/result"
    body = {"seq": a.turn.seq, "result": {"forged": True}}
    for bearer in (api.key, b.token, a.token[:-1] + "x", "nonsense"):
        resp = call(api, bearer, path, body)
        assert resp.status_code == 403, bearer
        assert resp.json()["error"] == "forbidden"
    bare = client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")
    for empty in (api.as_key("").post(path, body), bare):
        assert empty.status_code == 401 and empty.json()["error"] == "unauthenticated"
    assert Ticket.objects.get(id=a.ticket.id).state == "running"
    assert call(api, a.token, path, {"seq": a.turn.seq, "result": {"ok": 1}}).status_code == 200
    assert Ticket.objects.get(id=a.ticket.id).result == {"ok": 1}


def test_an_unknown_turn_and_a_wrong_token_look_the_same(api):
    s = started("same")
    unknown = call(
        api, s.token, "/turns/01930000-0000-7000-8000-000000000000/heartbeat", {"seq": 1}
    )
    wrong = call(api, "nonsense", f"/turns/{s.turn.id}/heartbeat", {"seq": 1})
    assert unknown.status_code == wrong.status_code == 403
    assert unknown.json() == wrong.json()


def test_a_turn_from_before_tokens_accepts_no_credential(api):
    s = started("legacy")
    # Fixture shortcut: a turn row written before this column existed.
    Turn.objects.filter(id=s.turn.id).update(token_sha256="")
    resp = call(api, s.token, f"/turns/{s.turn.id}/heartbeat", {"seq": s.turn.seq})
    assert resp.status_code == 403


def test_reading_a_turn_takes_its_token_or_a_key_that_sees_its_ticket(api, django_user_model):
    from accounts.keys import create_api_key

    s = started("read")
    assert api.as_key(s.token).get(f"/turns/{s.turn.id}").status_code == 200
    assert api.get(f"/turns/{s.turn.id}").status_code == 200  # staff
    django_user_model.objects.create_user("mallory")
    _, stranger = create_api_key(username="mallory")
    assert api.as_key(stranger).get(f"/turns/{s.turn.id}").status_code == 404
    # A turn token is not an API key anywhere else.
    assert api.as_key(s.token).get(f"/tickets/{s.ticket.id}").status_code == 401


def run_one(address: str, runner: dict, tmp_path) -> tuple[Ticket, str]:
    """Run one turn in-process; returns the ticket and the token its runner
    was given (the runner wrote it to a file, outside the ledger)."""
    path = tmp_path / f"{address}.token"
    create_endpoint(address=address, runner=runner)
    ticket = admit_ticket(endpoint=address, input={"path": str(path)}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    return Ticket.objects.get(id=ticket.id), path.read_text()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_python_and_command_runners_get_their_turns_token(tmp_path):
    python, token = run_one(
        "py", {"kind": "python", "path": "tests.endpoints.token_runners.keeps_its_token"}, tmp_path
    )
    assert python.state == "succeeded", python.error
    assert sha256(token) == Turn.objects.get(id=python.turn_id).token_sha256
    code = (
        "import json, sys; env = json.load(sys.stdin); "
        "open(env['ticket']['input']['path'], 'w').write(env['turn']['token']); "
        "print(json.dumps({'result': {'ok': 1}}))"
    )
    command, token = run_one(
        "cmd", {"kind": "command", "argv": [sys.executable, "-c", code]}, tmp_path
    )
    assert command.state == "succeeded", command.error
    assert sha256(token) == Turn.objects.get(id=command.turn_id).token_sha256
    assert token not in ledger_text()


def test_a_careless_runner_cannot_write_its_token_into_the_ledger(tmp_path, caplog):
    runner = {"kind": "python", "path": "tests.endpoints.token_runners.returns_its_envelope"}
    with caplog.at_level("DEBUG"):
        ticket, token = run_one("careless", runner, tmp_path)
    assert ticket.state == "succeeded", ticket.error
    envelope = ticket.result["envelope"]
    assert envelope["turn"]["token"] == "[turn token]"
    assert envelope["turn"]["id"] == str(ticket.turn_id)
    assert token not in ticket.result["ctx"]  # the context's repr leaves it out
    assert token not in ledger_text()
    assert token not in caplog.text


def test_a_command_echoing_its_stdin_to_stderr_leaks_no_token(tmp_path):
    code = "import sys; sys.stderr.write(sys.stdin.read()); sys.exit(3)"
    create_endpoint(
        address="echoer", runner={"kind": "command", "argv": [sys.executable, "-c", code]}
    )
    ticket = admit_ticket(endpoint="echoer", input={"q": 1}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "failed" and ticket.error["code"] == "command_failed"
    assert '"token": "[turn token]"' in ticket.error["stderr"]


def test_a_logged_context_shows_no_token(tmp_path, caplog):
    # Inline: caplog sees this process's records, not a forked turn's.
    runner = {
        "kind": "python",
        "path": "tests.endpoints.token_runners.logs_its_context",
        "isolation": "inline",
    }
    with caplog.at_level("DEBUG"):
        ticket, token = run_one("logger", runner, tmp_path)
    assert ticket.state == "succeeded", ticket.error
    assert "running with TurnContext(" in caplog.text
    assert token not in caplog.text
    assert token not in ledger_text()


def test_a_result_posted_with_the_token_in_it_is_stored_without_it(api):
    s = started("poster")
    resp = api.as_key(s.token).post(
        f"/turns/{s.turn.id}/result", {"seq": s.turn.seq, "result": {"echo": s.token}}
    )
    assert resp.status_code == 200
    assert Ticket.objects.get(id=s.ticket.id).result == {"echo": "[turn token]"}
    assert s.token not in ledger_text()
