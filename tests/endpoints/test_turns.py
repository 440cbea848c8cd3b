"""The turn runtime with a real Celery worker against PostgreSQL and Redis."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from config.celery import app as celery_app
from core.dispatch import RUN_TICKET
from endpoints.models import Endpoint
from endpoints.runner_spec import COMMAND_BASE_ENV
from tests.conftest import TEST_RUNNER_SECRET, broker_queue_length, purge_broker, wait_for
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, Ticket, TicketEvent, Turn

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def terminal(ids):
    def check():
        rows = Ticket.objects.filter(id__in=ids).values_list("state", flat=True)
        return all(s in ("succeeded", "failed", "cancelled", "orphaned") for s in rows)

    return check


@pytest.mark.parametrize("hand_on", [False, True], ids=["through-the-broker", "hand-on"])
def test_twenty_tickets_on_one_endpoint_never_overlap(celery_procs, make_endpoint, hand_on):
    if hand_on:
        celery_procs.worker_and_beat()
    else:
        # Every ticket through the broker, and every pool process exits after
        # ten messages: the twenty turns run in two processes at least, and
        # what keeps them apart and in order is in the database (the lock
        # row, the seq), not in a process.
        celery_procs.env["TURN_CHAIN_MAX"] = "1"
        celery_procs.worker(embedded_beat=True, max_tasks_per_child=10)
    make_endpoint("serial", path="runtime.demo.sleep")
    ids = [
        admit_ticket(endpoint="serial", input={"seconds": 0.05, "n": i}).ticket.id
        for i in range(20)
    ]
    wait_for(terminal(ids), timeout=60, message="20 tickets to finish")
    turns = list(Turn.objects.filter(ticket_id__in=ids).order_by("seq"))
    assert len(turns) == 20
    assert all(t.state == "completed" for t in turns)
    seqs = [t.seq for t in turns]
    assert seqs == sorted(set(seqs)) and seqs == list(range(seqs[0], seqs[0] + 20))
    for earlier, later in zip(turns, turns[1:], strict=False):
        # The exclusive lock: each turn ended before the next one started.
        assert earlier.ended_at <= later.started_at, (earlier.seq, later.seq)
    # FIFO per endpoint: tickets ran in admission order.
    assert [t.ticket_id for t in turns] == ids
    if hand_on:
        # A process started the backlog's next tickets itself: they share the
        # task (the message) that started the first of them.
        assert len({t.celery_task_id for t in turns}) < len(turns)
    else:
        # Several processes, one message each.
        assert len({t.worker["pid"] for t in turns}) >= 2
        assert len({t.celery_task_id for t in turns}) == len(turns)
    assert EndpointLock.objects.get(endpoint__address="serial").holder_id is None


def test_same_ticket_published_twice_runs_once(celery_procs, make_endpoint):
    make_endpoint("twice", path="runtime.demo.echo")
    ticket = admit_ticket(endpoint="twice", input={"x": 1}).ticket
    # Three copies of the dispatch message. The worker's dispatcher may add a
    # fourth (the ticket owes a dispatch) or find the ticket already started by
    # a copy and add none: only the three copies are certain.
    for _ in range(3):
        celery_app.send_task(RUN_TICKET, args=[str(ticket.id)])
    celery_procs.worker()
    wait_for(terminal([ticket.id]), message="the ticket to finish")
    # Give the duplicates time to be consumed: wait until the broker is empty.
    wait_for(lambda: broker_queue_length("turns") == 0, message="the broker queue to drain")
    wait_for(
        lambda: celery_procs.log("turns").count(b"succeeded in") >= 3,
        timeout=30,
        message="the three copies to be processed",
    )
    assert Turn.objects.filter(ticket=ticket).count() == 1
    assert TicketEvent.objects.filter(ticket=ticket, kind="turn_started").count() == 1
    assert Ticket.objects.get(id=ticket.id).result == {"echo": {"x": 1}}


def test_queued_tickets_whose_messages_were_lost_still_complete(celery_procs, make_endpoint):
    make_endpoint("lost", path="runtime.demo.echo")
    ids = [admit_ticket(endpoint="lost", input={"n": i}).ticket.id for i in range(5)]
    purge_broker()  # the broker forgot every dispatch message
    celery_procs.worker_and_beat()
    wait_for(terminal(ids), timeout=40, message="re-dispatched tickets to finish")
    assert set(Ticket.objects.filter(id__in=ids).values_list("state", flat=True)) == {"succeeded"}


class Agent:
    """A remote agent on 127.0.0.1: accepts a turn (202) and answers later."""

    def __init__(self):
        self.envelopes: list[dict] = []
        self.cancels: list[dict] = []
        self.authorization: list[str | None] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/cancel":
                    agent.authorization.append(self.headers.get("Authorization"))
                (agent.cancels if self.path == "/cancel" else agent.envelopes).append(body)
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def agent(settings, monkeypatch):
    # The agent listens on loopback: the outbound URL policy refuses it unless
    # the operator lists the host, here and in the worker, which checks it
    # again when it sends (so the worker must start after this fixture).
    settings.DELIVERY_ALLOWED_HOSTS = ["127.0.0.1"]
    monkeypatch.setenv("DELIVERY_ALLOWED_HOSTS", "127.0.0.1")
    a = Agent()
    yield a
    a.close()


def as_turn(api, envelope):
    """The turn API as the agent calls it: with the turn's own token."""
    return api.as_key(envelope["turn"]["token"])


def test_stale_seq_is_refused_and_changes_nothing(agent, worker, make_endpoint, api):
    make_endpoint(
        "remote",
        runner={"kind": "http", "url": f"{agent.url}/turn", "cancel_url": f"{agent.url}/cancel"},
    )
    ticket = admit_ticket(endpoint="remote", input={"ask": "later"}).ticket
    wait_for(lambda: agent.envelopes, message="the agent to receive the turn")
    env = agent.envelopes[0]
    turn_id, seq = env["turn"]["id"], env["turn"]["seq"]
    assert env["ticket"]["id"] == str(ticket.id)
    # The credential arrives in the body and as the request's Authorization.
    assert agent.authorization == [f"Bearer {env['turn']['token']}"]
    turn_api = as_turn(api, env)
    before = Ticket.objects.get(id=ticket.id)

    # A user's key, even staff's, cannot speak for the turn.
    refused = api.post(f"/turns/{turn_id}/result", {"seq": seq, "result": {"forged": True}})
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"

    hb = turn_api.post(f"/turns/{turn_id}/heartbeat", {"seq": seq})
    assert hb.status_code == 200 and hb.json()["interrupt_requested"] is False

    stale = turn_api.post(f"/turns/{turn_id}/result", {"seq": seq + 7, "result": {"forged": True}})
    assert stale.status_code == 409 and stale.json()["error"] == "stale_turn"
    after = Ticket.objects.get(id=ticket.id)
    assert (after.state, after.result, after.updated_at) == ("running", None, before.updated_at)
    assert TicketEvent.objects.filter(ticket=ticket, kind="stale_outcome").count() == 1
    assert turn_api.post(f"/turns/{turn_id}/heartbeat", {"seq": seq - 1}).status_code == 409

    ok = turn_api.post(f"/turns/{turn_id}/result", {"seq": seq, "result": {"answer": 42}})
    assert ok.status_code == 200, ok.content
    done = api.get(f"/tickets/{ticket.id}").json()
    assert done["state"] == "succeeded" and done["result"] == {"answer": 42}
    assert done["turn"] == {"id": turn_id, "seq": seq, "state": "completed"}
    # The same result again is now late: refused, nothing changes.
    again = turn_api.post(f"/turns/{turn_id}/result", {"seq": seq, "result": {"answer": 43}})
    assert again.status_code == 409
    assert Ticket.objects.get(id=ticket.id).result == {"answer": 42}


GROUP_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    sys.stdin.read()
    work = "import time; time.sleep(120)"  # the behaviour under test: a child's own work
    child = subprocess.Popen([sys.executable, "-c", work])
    with open(sys.argv[1], "w") as f:
        json.dump({"leader": os.getpid(), "child": child.pid}, f)
    time.sleep(120)  # the behaviour under test: a command's own work
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_command_runner_interrupt_stops_its_whole_process_group(worker, make_endpoint, tmp_path):
    script = tmp_path / "group.py"
    script.write_text(GROUP_SCRIPT)
    pids = tmp_path / "pids.json"
    make_endpoint(
        "cmd",
        runner={"kind": "command", "argv": [sys.executable, str(script), str(pids)]},
        turn_budget_s=1.5,
        interrupt_grace_s=8,
    )
    ticket = admit_ticket(endpoint="cmd", input={}).ticket
    wait_for(pids.exists, message="the command to start")
    wait_for(lambda: pids.read_text().strip(), message="the pid file")
    procs = json.loads(pids.read_text())
    wait_for(terminal([ticket.id]), timeout=30, message="the interrupted turn to stop")
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "failed" and t.error["code"] == "timed_out"
    turn = Turn.objects.get(ticket=ticket)
    assert turn.state == "stopped"
    assert turn.stop_evidence["kind"] == "process_exit"
    assert turn.stop_evidence["detail"]["signal"] == "SIGTERM"
    assert turn.stop_evidence["seq"] == turn.seq
    wait_for(
        lambda: not _alive(procs["leader"]) and not _alive(procs["child"]),
        timeout=10,
        message="leader and grandchild to be gone",
    )
    assert Endpoint.objects.get(address="cmd").state == "available"


def test_bad_command_output_is_a_clear_failure(worker, make_endpoint):
    make_endpoint(
        "badcmd", runner={"kind": "command", "argv": [sys.executable, "-c", "print('not json')"]}
    )
    ticket = admit_ticket(endpoint="badcmd", input={}).ticket
    wait_for(terminal([ticket.id]), message="the command ticket to fail")
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "failed" and t.error["code"] == "bad_output"
    assert "not json" in t.error["stdout_head"]


def test_command_runner_result_and_history(worker, make_endpoint):
    code = (
        "import json,sys; env=json.load(sys.stdin); "
        "print(json.dumps({'result': {'n': len(env['history']), "
        "'got': env['ticket']['input']}}))"
    )
    make_endpoint("hist", runner={"kind": "command", "argv": [sys.executable, "-c", code]})
    first = admit_ticket(endpoint="hist", input={"a": 1}).ticket
    wait_for(terminal([first.id]), message="first")
    second = admit_ticket(endpoint="hist", input={"a": 2}).ticket
    wait_for(terminal([second.id]), message="second")
    assert Ticket.objects.get(id=first.id).result == {"n": 0, "got": {"a": 1}}
    assert Ticket.objects.get(id=second.id).result == {"n": 1, "got": {"a": 2}}


def test_command_gets_named_secrets_and_not_the_workers_environment(worker, make_endpoint):
    # The command prints its environment, the secret's digest and the secret
    # itself: the digest proves it got the value, the ledger keeps none.
    code = (
        "import hashlib,json,os,sys; json.load(sys.stdin); t=os.environ['AGENT_TOKEN']; "
        "print(json.dumps({'result': {'env': sorted(os.environ), 'token': t, "
        "'sha': hashlib.sha256(t.encode()).hexdigest()}}))"
    )
    make_endpoint(
        "envcmd",
        runner={
            "kind": "command",
            "argv": [sys.executable, "-c", code],
            "env": {"AGENT_TOKEN": {"secret": "TEST_RUNNER_SECRET"}},
        },
    )
    ticket = admit_ticket(endpoint="envcmd", input={}).ticket
    wait_for(terminal([ticket.id]), message="the command ticket")
    seen = Ticket.objects.get(id=ticket.id).result
    assert seen["sha"] == hashlib.sha256(TEST_RUNNER_SECRET.encode()).hexdigest()
    assert seen["token"] == "[secret TEST_RUNNER_SECRET]"
    assert not {"DATABASE_URL", "SECRET_KEY", "CELERY_BROKER_URL"} & set(seen["env"])
    assert set(seen["env"]) <= {"AGENT_TOKEN", *COMMAND_BASE_ENV}


def test_command_with_a_secret_this_host_lacks_fails_before_running(worker, make_endpoint):
    make_endpoint(
        "nosecret",
        runner={
            "kind": "command",
            "argv": [sys.executable, "-c", "print('{}')"],
            "env": {"AGENT_TOKEN": {"secret": "NOT_HELD_HERE"}},
        },
    )
    ticket = admit_ticket(endpoint="nosecret", input={}).ticket
    wait_for(terminal([ticket.id]), message="the command ticket")
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "failed" and t.error["code"] == "secret_missing"
    assert "NOT_HELD_HERE" in t.error["detail"]


def test_demo_endpoints_work_through_the_worker(worker, api):
    from django.core.management import call_command

    call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    echo = api.post("/tickets", {"endpoint": "demo.echo", "input": {"hi": 1}, "wait_s": 15})
    assert echo.json()["state"] == "succeeded" and echo.json()["result"] == {"echo": {"hi": 1}}
    fail = api.post("/tickets", {"endpoint": "demo.fail", "input": {}, "wait_s": 15})
    assert fail.json()["state"] == "failed" and fail.json()["error"]["code"] == "runner_raised"
    slp = api.post("/tickets", {"endpoint": "demo.sleep", "input": {"seconds": 0.2}, "wait_s": 15})
    assert slp.json()["state"] == "succeeded" and slp.json()["result"]["interrupted"] is False


def test_wait_s_returns_within_its_bound(worker, api, make_endpoint):
    import time

    make_endpoint("slow", path="runtime.demo.sleep")
    started = time.monotonic()
    resp = api.post("/tickets", {"endpoint": "slow", "input": {"seconds": 5}, "wait_s": 0.5})
    elapsed = time.monotonic() - started
    assert resp.status_code == 201
    assert resp.json()["state"] in ("queued", "running")
    assert elapsed < 1.5


def test_busy_policy_reject(worker, api, make_endpoint):
    make_endpoint("solo", path="runtime.demo.sleep", busy_policy="reject")
    first = api.post("/tickets", {"endpoint": "solo", "input": {"seconds": 3}}).json()
    wait_for(lambda: Ticket.objects.get(id=first["id"]).state == "running", message="running")
    resp = api.post("/tickets", {"endpoint": "solo", "input": {"seconds": 0}})
    assert resp.status_code == 409 and resp.json()["error"] == "endpoint_busy"


def test_cancel_queued_running_and_finished(worker, api, make_endpoint):
    make_endpoint("cancel", path="runtime.demo.sleep")
    running = api.post("/tickets", {"endpoint": "cancel", "input": {"seconds": 30}}).json()
    queued = api.post("/tickets", {"endpoint": "cancel", "input": {"seconds": 0}}).json()
    wait_for(lambda: Ticket.objects.get(id=running["id"]).state == "running", message="running")
    c1 = api.post(f"/tickets/{queued['id']}/cancel")
    assert c1.status_code == 200 and c1.json()["state"] == "cancelled"
    c2 = api.post(f"/tickets/{running['id']}/cancel")
    assert c2.status_code == 200 and c2.json()["state"] == "running"
    wait_for(
        lambda: Ticket.objects.get(id=running["id"]).state == "cancelled",
        timeout=15,
        message="the running ticket to stop and be cancelled",
    )
    assert Turn.objects.get(ticket_id=running["id"]).state == "stopped"
    c3 = api.post(f"/tickets/{running['id']}/cancel")
    assert c3.status_code == 409 and c3.json()["error"] == "invalid_transition"
    assert c3.json()["state"] == "cancelled"


def test_http_agent_is_asked_to_stop_and_its_receipt_is_the_evidence(
    agent, worker, make_endpoint, api
):
    make_endpoint(
        "remote2",
        runner={"kind": "http", "url": f"{agent.url}/turn", "cancel_url": f"{agent.url}/cancel"},
        turn_budget_s=1,
        interrupt_grace_s=20,
    )
    ticket = admit_ticket(endpoint="remote2", input={}).ticket
    wait_for(lambda: agent.envelopes, message="the agent to receive the turn")
    turn_id, seq = agent.envelopes[0]["turn"]["id"], agent.envelopes[0]["turn"]["seq"]
    turn_api = as_turn(api, agent.envelopes[0])
    # Past its budget the sweep interrupts the exact turn and calls the agent.
    wait_for(lambda: agent.cancels, timeout=15, message="the cancel request")
    assert agent.cancels[0] == {"turn": turn_id, "seq": seq}
    hb = turn_api.post(f"/turns/{turn_id}/heartbeat", {"seq": seq})
    assert hb.json()["interrupt_requested"] is True
    # Only the turn's own credential may say it stopped.
    assert api.post(f"/turns/{turn_id}/stopped", {"seq": seq}).status_code == 403
    # A receipt naming another seq proves nothing.
    assert turn_api.post(f"/turns/{turn_id}/stopped", {"seq": seq + 1}).status_code == 409
    resp = turn_api.post(f"/turns/{turn_id}/stopped", {"seq": seq, "detail": "cancelled at step 3"})
    assert resp.status_code == 200, resp.content
    turn = resp.json()
    assert turn["state"] == "stopped"
    assert turn["stop_evidence"]["kind"] == "agent_stop_receipt"
    t = api.get(f"/tickets/{ticket.id}").json()
    assert t["state"] == "failed" and t["error"]["code"] == "timed_out"
    assert api.get("/endpoints/remote2").json()["lock"]["holder_turn"] is None


def test_a_worker_keeps_its_database_connection_from_turn_to_turn(celery_procs, make_endpoint):
    """Celery's Django fixup closes every connection around every task unless
    CELERY_DB_REUSE_MAX is set: each turn then opened a new PostgreSQL
    session (half a turn's time in bench/turns.py). Ten turns in one pool
    process open at most a couple of sessions, not ten."""
    from django.db import connection

    def sessions() -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            return cur.fetchone()[0]

    make_endpoint("reuse", path="runtime.demo.echo", isolation="inline")
    celery_procs.env["DB_CONN_MAX_AGE"] = "60"  # production's default, whatever the tests' is
    celery_procs.worker(concurrency=1)
    warm = admit_ticket(endpoint="reuse", input={"n": -1}).ticket.id
    wait_for(terminal([warm]), message="the first turn")
    before = sessions()
    ids = []
    for i in range(10):  # one at a time: each is its own task
        ids.append(admit_ticket(endpoint="reuse", input={"n": i}).ticket.id)
        wait_for(terminal(ids[-1:]), message=f"turn {i}")
    opened = sessions() - before
    assert set(Ticket.objects.filter(id__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert opened <= 3, f"{opened} PostgreSQL sessions opened for 10 turns"


def test_a_turn_on_a_connection_the_database_severed_between_tasks_still_runs(
    celery_procs, make_endpoint
):
    """A turn skips the health check's ``SELECT 1`` (config/celery.py): a
    connection the database dropped while the pool process was idle fails the
    start's first statement instead, and the start is retried on a new one.
    Nothing is lost and the endpoint stays available."""
    from django.db import connection

    make_endpoint("severed", path="runtime.demo.echo", isolation="inline")
    celery_procs.env["DB_CONN_MAX_AGE"] = "60"  # kept between tasks, as in production
    celery_procs.worker(concurrency=1)
    warm = admit_ticket(endpoint="severed", input={"n": -1}).ticket.id
    wait_for(terminal([warm]), message="the first turn")
    with connection.cursor() as cur:  # every session but this test's: the worker's
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        assert cur.fetchone()[0] >= 1
    ids = [admit_ticket(endpoint="severed", input={"n": i}).ticket.id for i in range(3)]
    wait_for(terminal(ids), timeout=30, message="the turns after the sessions were severed")
    assert set(Ticket.objects.filter(id__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert Endpoint.objects.get(address="severed").state == "available"


@pytest.mark.django_db(transaction=True)
def test_only_a_turn_skips_the_health_check_between_tasks():
    from celery import signals
    from django.db import connection

    from config.celery import _database_connections

    connection.ensure_connection()
    from types import SimpleNamespace

    from core.dispatch import DELIVER

    run_ticket, deliver = SimpleNamespace(name=RUN_TICKET), SimpleNamespace(name=DELIVER)
    _database_connections(signal=signals.task_prerun, task=run_ticket)
    assert connection.health_check_done  # the start's retry stands in for it
    _database_connections(signal=signals.task_postrun, task=run_ticket)
    assert not connection.health_check_done
    _database_connections(signal=signals.task_prerun, task=deliver)
    assert not connection.health_check_done  # every other task checks first


def test_replies_the_ledger_cannot_store_fail_their_tickets_and_no_sweep_quarantines(
    worker, make_endpoint
):
    """A real worker and its sweeps: each reply ends its ticket failed (the
    worker's task did not die), the sweeps find nothing to quarantine, and
    the endpoints run their next tickets."""
    from datetime import timedelta

    from django.utils import timezone

    from health.models import SweepRun
    from recovery.models import RecoveryCase
    from tests.endpoints.deep_runners import nest_text
    from tests.endpoints.test_bounds import PRINT_REPLY

    make_endpoint("cmd", runner={"kind": "command", "argv": [sys.executable, "-c", PRINT_REPLY]})
    make_endpoint("py", path="tests.endpoints.deep_runners.unstorable")
    sent = [
        ("cmd", {"reply": '{"result": {"a": "\\u0000"}}'}, "unstorable_result"),
        ("cmd", {"reply": '{"result": ' + nest_text(800, "x") + "}"}, "unstorable_result"),
        ("py", {"kind": "surrogate"}, "unstorable_result"),
        ("py", {"kind": "deep"}, "unstorable_result"),
        ("py", {"kind": "mixed_keys"}, "runtime_error"),
    ]
    ids = [admit_ticket(endpoint=address, input=body).ticket.id for address, body, _ in sent]
    wait_for(terminal(ids), timeout=60, message="every ticket to end")
    for ticket_id, (_, _, code) in zip(ids, sent, strict=True):
        ticket = Ticket.objects.get(id=ticket_id)
        assert (ticket.state, ticket.error["code"]) == ("failed", code), ticket.error
    # The budget sweep runs every 0.5 s: two seconds of its runs after the
    # last ticket ended find nothing to interrupt or quarantine.
    ended = timezone.now()
    wait_for(
        lambda: SweepRun.objects.filter(
            name="budgets", last_finished_at__gte=ended + timedelta(seconds=2)
        ).exists(),
        timeout=30,
        message="two seconds of budget sweeps",
    )
    assert not RecoveryCase.objects.exists()
    assert set(Endpoint.objects.values_list("state", flat=True)) == {"available"}
    good = [
        admit_ticket(endpoint="cmd", input={"reply": '{"result": 1}'}).ticket.id,
        admit_ticket(endpoint="py", input={"kind": "fine"}).ticket.id,
    ]
    wait_for(terminal(good), timeout=60, message="the next tickets")
    assert set(Ticket.objects.filter(id__in=good).values_list("state", flat=True)) == {"succeeded"}
