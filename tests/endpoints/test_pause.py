"""An owner's pause of an endpoint (docs/explanation/design.md, "Pause"), against real
PostgreSQL: a pause racing a start (threads, real row locks), admission
under both busy policies, the dispatcher and the lost-dispatch sweep
leaving a paused endpoint alone, a release keeping the marks, pause and
quarantine side by side, and the API (owners only, reasons, idempotent)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts.keys import create_api_key
from core.errors import EndpointPaused, Forbidden, Invalid
from endpoints.models import Endpoint, EndpointEvent
from recovery import services as recovery_services
from runtime import services as runtime_services
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import wait_for
from tests.racing import race
from tests.recovery.conftest import drive_to_quarantine
from tickets.admission import admit_ticket
from tickets.models import EndpointLock, LedgerEvent, Ticket, Turn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("owner")


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user("stranger")


def _pause(address, user, reason="maintenance window"):
    return runtime_services.pause_endpoint(address=address, user=user, reason=reason)


def _resume(address, user, reason="maintenance done"):
    return runtime_services.resume_endpoint(address=address, user=user, reason=reason)


def _someone_waits_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cur.fetchone()[0] > 0


# --- The race: a pause and a start ------------------------------------------------


def test_a_pause_racing_a_start_either_lets_the_turn_run_or_starts_nothing(make_endpoint, owner):
    """Twenty rounds of a start and a pause released together. The pause's
    event names the turn it found running: a turn exists exactly when the
    start committed before the pause (then it runs and finishes, and nothing
    else starts); otherwise nothing started. Never a turn started after the
    pause committed."""
    outcomes = {"start first": 0, "pause first": 0}
    for round_ in range(20):
        address = f"pause-race-{round_}"
        make_endpoint(address, owners=[owner.username])
        first = admit_ticket(endpoint=address, input={"n": 1}).ticket
        Ticket.objects.filter(id=first.id).update(needs_dispatch=False)

        results = race(
            lambda first=first: runtime.start_turn(ticket_id=first.id),
            lambda address=address: _pause(address, owner),
        )
        started, (endpoint, changed) = results
        assert changed and endpoint.paused_at is not None
        event = EndpointEvent.objects.get(endpoint=endpoint, kind="paused")
        turns = list(Turn.objects.filter(endpoint=endpoint))
        if started is None:
            outcomes["pause first"] += 1
            assert turns == [] and event.detail["running_turn"] is None
            assert Ticket.objects.get(id=first.id).state == "queued"
        else:
            outcomes["start first"] += 1
            assert [t.id for t in turns] == [started.turn.id]
            assert event.detail["running_turn"] == str(started.turn.id)
            # The running turn drains: it finishes, the lock is released.
            done = runtime.finish_turn(
                turn_id=started.turn.id,
                seq=started.turn.seq,
                outcome=Outcome.success({"ok": True}),
                source="worker",
            )
            assert done.accepted
            assert Ticket.objects.get(id=first.id).state == "succeeded"
            assert EndpointLock.objects.get(endpoint=endpoint).holder_id is None
        # Paused: a ticket admitted now waits, whatever message arrives for it.
        later = admit_ticket(endpoint=address, input={"n": 2}).ticket
        assert runtime.start_turn(ticket_id=later.id) is None
        assert Turn.objects.filter(endpoint=endpoint).count() == len(turns)
        waiting = Ticket.objects.get(id=later.id)
        assert waiting.state == "queued" and waiting.needs_dispatch
    # Both orders happen on this machine; neither is asserted to (a slow
    # host may always let one thread first).
    assert sum(outcomes.values()) == 20, outcomes


def test_a_start_waiting_on_a_pause_starts_nothing(make_endpoint, owner):
    """The pause holds the endpoint row, uncommitted, when the start reaches
    it: the start waits, re-tests the row at the pause's commit, finds it
    paused and writes only its ticket's mark."""
    endpoint = make_endpoint("pause-holds", owners=[owner.username])
    ticket = admit_ticket(endpoint="pause-holds", input={}).ticket
    Ticket.objects.filter(id=ticket.id).update(needs_dispatch=False)
    held, release = threading.Event(), threading.Event()

    def pause():
        with transaction.atomic():
            _pause("pause-holds", owner)
            held.set()
            assert release.wait(20)

    def start():
        assert held.wait(20)
        return runtime.start_turn(ticket_id=ticket.id)

    def referee():
        wait_for(
            _someone_waits_on_a_lock,
            interval=0.02,
            message="the start to wait on the endpoint row",
        )
        release.set()

    results = race(pause, start, referee)
    assert results[1] is None
    t = Ticket.objects.get(id=ticket.id)
    assert t.state == "queued" and t.needs_dispatch and t.turn_id is None
    assert not Turn.objects.filter(endpoint_id=endpoint.id).exists()
    assert Endpoint.objects.get(id=endpoint.id).turn_seq == 0


def test_a_pause_waiting_on_a_start_lets_its_turn_run(make_endpoint, owner):
    """The start's transaction holds the endpoint row when the pause reaches
    it: the pause waits for the commit and then names the started turn as
    the one that drains."""
    endpoint = make_endpoint("start-holds", owners=[owner.username])
    ticket = admit_ticket(endpoint="start-holds", input={}).ticket
    held, release = threading.Event(), threading.Event()

    def start():
        with transaction.atomic():
            started = runtime.start_turn(ticket_id=ticket.id)
            held.set()
            assert release.wait(20)
        return started

    def pause():
        assert held.wait(20)
        return _pause("start-holds", owner)

    def referee():
        wait_for(
            _someone_waits_on_a_lock,
            interval=0.02,
            message="the pause to wait on the endpoint row",
        )
        release.set()

    started, (paused, changed), _ = race(start, pause, referee)
    assert started is not None and changed and paused.paused_at is not None
    event = EndpointEvent.objects.get(endpoint=endpoint, kind="paused")
    assert event.detail["running_turn"] == str(started.turn.id)
    assert Ticket.objects.get(id=ticket.id).state == "running"


# --- Admission while paused ---------------------------------------------------------


def test_a_paused_enqueue_endpoint_queues_new_tickets(make_endpoint, owner):
    make_endpoint("paused-enqueue", owners=[owner.username], busy_policy="enqueue")
    _pause("paused-enqueue", owner)
    admitted = admit_ticket(endpoint="paused-enqueue", input={"q": 1})
    t = Ticket.objects.get(id=admitted.ticket.id)
    assert t.state == "queued" and t.needs_dispatch


def test_a_paused_reject_endpoint_refuses_new_tickets_with_endpoint_paused(
    make_endpoint, owner, api, stranger
):
    make_endpoint("paused-reject", owners=[owner.username], busy_policy="reject")
    _pause("paused-reject", owner)
    with pytest.raises(EndpointPaused) as refused:
        admit_ticket(endpoint="paused-reject", input={"q": 1})
    assert refused.value.status == 409 and refused.value.code == "endpoint_paused"
    assert not Ticket.objects.filter(endpoint__address="paused-reject").exists()
    # Through the API, as a submitter sees it.
    _, key = create_api_key(username=stranger.username)
    resp = api.as_key(key).post("/tickets", {"endpoint": "paused-reject", "input": {"q": 2}})
    assert resp.status_code == 409, resp.content
    assert resp.json()["error"] == "endpoint_paused"
    # Resumed, it takes work again.
    _resume("paused-reject", owner)
    assert admit_ticket(endpoint="paused-reject", input={"q": 3}).ticket.state == "queued"


def test_a_rerun_an_owner_authorised_queues_on_a_paused_reject_endpoint(make_endpoint, owner):
    """A re-run is an owner's decision, not new work: like a busy reject
    endpoint, a paused one queues it (it starts on resume)."""
    make_endpoint("paused-rerun", owners=[owner.username], busy_policy="reject")
    original = admit_ticket(endpoint="paused-rerun", input={"q": 1}).ticket
    _pause("paused-rerun", owner)
    rerun = admit_ticket(
        endpoint="paused-rerun", input={"q": 1}, parent_id=original.id, rerun_of_id=original.id
    ).ticket
    assert rerun.state == "queued"


# --- Dispatch while paused and on resume ---------------------------------------------


def test_the_dispatcher_leaves_a_paused_endpoint_alone_and_serves_it_on_resume(
    make_endpoint, owner
):
    make_endpoint("paused-dispatch", owners=[owner.username])
    _pause("paused-dispatch", owner)
    ids = [admit_ticket(endpoint="paused-dispatch", input={"i": i}).ticket.id for i in range(3)]
    # Marked, and no pass takes them: no message, no spin.
    for _ in range(3):
        assert runtime.dispatch_owed() == []
    assert Ticket.objects.filter(id__in=ids, needs_dispatch=True).count() == 3
    _resume("paused-dispatch", owner)
    # The oldest, once: its release publishes the next.
    assert runtime.dispatch_owed() == [ids[0]]
    assert runtime.dispatch_owed() == []


def test_a_release_while_paused_keeps_the_next_ticket_marked(make_endpoint, owner):
    """The running turn finishes after the pause: the release hands the next
    ticket to nobody (no turn started in the finish, no publish); it keeps
    its mark for the dispatcher's pass after the resume."""
    make_endpoint("paused-release", owners=[owner.username])
    first = admit_ticket(endpoint="paused-release", input={"i": 1}).ticket
    started = runtime.start_turn(ticket_id=first.id)
    second = admit_ticket(endpoint="paused-release", input={"i": 2}).ticket
    _pause("paused-release", owner)
    done = runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({}),
        source="worker",
        start_next=True,
        celery_task_id="paused-release-task",
    )
    assert done.accepted and done.started is None
    t = Ticket.objects.get(id=second.id)
    assert t.state == "queued" and t.needs_dispatch
    _resume("paused-release", owner)
    assert runtime.dispatch_owed() == [second.id]


def test_the_lost_dispatch_sweep_leaves_a_paused_endpoints_tickets_alone(
    make_endpoint, owner, settings
):
    settings.REDISPATCH_AFTER_S = 0
    make_endpoint("paused-sweep", owners=[owner.username])
    _pause("paused-sweep", owner)
    ticket = admit_ticket(endpoint="paused-sweep", input={}).ticket
    # As if its mark had been taken by a message since lost.
    Ticket.objects.filter(id=ticket.id).update(needs_dispatch=False)
    updated_at = Ticket.objects.get(id=ticket.id).updated_at
    wait_for(lambda: timezone.now() > updated_at, message="the ticket to be older than the cutoff")
    assert runtime.sweep_lost_dispatches() == []
    _resume("paused-sweep", owner)
    assert runtime.sweep_lost_dispatches() == [ticket.id]


# --- Pause and quarantine, side by side ----------------------------------------------


def test_pause_and_quarantine_hold_together_and_neither_clears_the_other(make_endpoint, owner):
    make_endpoint(
        "paused-stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        interrupt_grace_s=0.05,
    )
    stuck = admit_ticket(endpoint="paused-stuck", input={"seconds": 30}).ticket
    # The pause lands while the turn runs; the turn overruns and is quarantined.
    q = drive_to_quarantine_after_pause(stuck.id, owner)
    endpoint = Endpoint.objects.get(id=q.endpoint.id)
    assert endpoint.state == "quarantined" and endpoint.paused_at is not None
    # A resume does not clear the quarantine.
    endpoint, changed = _resume("paused-stuck", owner)
    assert changed and endpoint.state == "quarantined" and endpoint.paused_at is None
    # Paused again; the owner's decision leaves quarantine, not the pause.
    _pause("paused-stuck", owner, reason="hold it until we read the evidence")
    inspection = recovery_services.inspect_case(case_id=q.case.id, user=owner)
    recovery_services.decide(
        case_id=q.case.id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="not worth redoing",
    )
    endpoint.refresh_from_db()
    assert endpoint.state == "available" and endpoint.paused_at is not None
    assert endpoint.pause_reason == "hold it until we read the evidence"
    waiting = admit_ticket(endpoint="paused-stuck", input={"seconds": 0}).ticket
    assert runtime.start_turn(ticket_id=waiting.id) is None


def drive_to_quarantine_after_pause(ticket_id, owner):
    started = runtime.start_turn(ticket_id=ticket_id)
    assert started is not None
    _pause(started.endpoint.address, owner)
    # The rest of the runtime's own steps (tests/recovery/conftest.py) from
    # the interrupt on; drive_to_quarantine starts the turn itself, so
    # its steps are repeated here for the turn already running.
    assert runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
    from recovery.models import RecoveryCase
    from tests.conftest import wait_for

    case_id = wait_for(
        lambda: runtime.quarantine_turn(turn_id=started.turn.id),
        timeout=10,
        message="the quarantine",
    )

    class Q:
        endpoint = Endpoint.objects.get(id=started.endpoint.id)
        case = RecoveryCase.objects.get(id=case_id)

    return Q


def test_a_quarantine_decided_while_not_paused_dispatches_as_before(make_endpoint, owner):
    """The control: with no pause, the decision frees the endpoint and its
    queued ticket is served (so the test above shows the pause holding)."""
    make_endpoint(
        "unpaused-stuck",
        path="runtime.demo.stuck",
        owners=[owner.username],
        interrupt_grace_s=0.05,
    )
    stuck = admit_ticket(endpoint="unpaused-stuck", input={"seconds": 30}).ticket
    q = drive_to_quarantine(stuck.id)
    inspection = recovery_services.inspect_case(case_id=q.case.id, user=owner)
    recovery_services.decide(
        case_id=q.case.id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="not worth redoing",
    )
    waiting = admit_ticket(endpoint="unpaused-stuck", input={"seconds": 0}).ticket
    assert runtime.start_turn(ticket_id=waiting.id) is not None


# --- The services and the API ---------------------------------------------------------


def test_pause_and_resume_are_for_owners_and_need_a_reason(make_endpoint, owner, stranger):
    make_endpoint("paused-rules", owners=[owner.username])
    with pytest.raises(Forbidden):
        _pause("paused-rules", stranger)
    for reason in ("", "   ", None, 5):
        with pytest.raises(Invalid):
            _pause("paused-rules", owner, reason=reason)
    with pytest.raises(Invalid):
        _pause("paused-rules", owner, reason="x" * 2001)
    assert Endpoint.objects.get(address="paused-rules").paused_at is None
    assert not EndpointEvent.objects.filter(kind__in=["paused", "resumed"]).exists()


def test_pause_and_resume_through_the_api(make_endpoint, owner, stranger, api):
    make_endpoint("api-pause", owners=[owner.username], aliases=["api-pause-old"])
    _, owner_key = create_api_key(username=owner.username)
    _, stranger_key = create_api_key(username=stranger.username)
    as_owner, as_stranger = api.as_key(owner_key), api.as_key(stranger_key)
    body = {"reason": "upgrading the model"}

    # Not theirs: a stranger may read the endpoint (everyone may) but not pause it.
    resp = as_stranger.post("/endpoints/api-pause/pause", body)
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    resp = as_owner.post("/endpoints/no-such/pause", body)
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    # A reason is required.
    assert as_owner.post("/endpoints/api-pause/pause", {}).status_code == 422
    assert as_owner.post("/endpoints/api-pause/pause", {"reason": ""}).status_code == 422
    resp = as_owner.post("/endpoints/api-pause/pause", {"reason": "  "})
    assert resp.status_code == 400 and resp.json()["error"] == "invalid"

    resp = as_owner.post("/endpoints/api-pause-old/pause", body)  # an alias
    assert resp.status_code == 200, resp.content
    got = resp.json()
    assert got["changed"] is True and got["state"] == "available"
    assert got["paused"]["by"] == "user:owner" and got["paused"]["reason"] == body["reason"]
    # Idempotent: a second pause changes nothing and records nothing.
    again = as_owner.post("/endpoints/api-pause/pause", {"reason": "another reason"}).json()
    assert again["changed"] is False and again["paused"] == got["paused"]
    assert EndpointEvent.objects.filter(kind="paused").count() == 1
    # Everyone sees that it is paused; who and why only its owners and staff.
    seen = as_stranger.get("/endpoints/api-pause").json()["paused"]
    assert seen == {"at": got["paused"]["at"]}
    assert api.get("/endpoints/api-pause").json()["paused"] == got["paused"]

    assert as_stranger.post("/endpoints/api-pause/resume", body).status_code == 403
    resp = as_owner.post("/endpoints/api-pause/resume", {"reason": "done"})
    assert resp.status_code == 200 and resp.json()["changed"] is True
    assert resp.json()["paused"] is None
    assert as_owner.post("/endpoints/api-pause/resume", {"reason": "x"}).json()["changed"] is False
    events = list(EndpointEvent.objects.filter(kind__in=["paused", "resumed"]))
    assert [(e.kind, e.actor, e.detail["reason"]) for e in events] == [
        ("paused", "user:owner", "upgrading the model"),
        ("resumed", "user:owner", "done"),
    ]
    assert events[1].detail["paused_by"] == "user:owner"


def test_a_paused_ticket_keeps_no_event_of_its_own_until_it_starts(make_endpoint, owner):
    """A ticket waiting on a pause is simply queued: its history gains
    nothing while it waits (the endpoint's events say why)."""
    make_endpoint("paused-quiet", owners=[owner.username])
    _pause("paused-quiet", owner)
    ticket = admit_ticket(endpoint="paused-quiet", input={}).ticket
    runtime.start_turn(ticket_id=ticket.id)
    runtime.dispatch_owed()
    kinds = list(LedgerEvent.objects.filter(ticket_id=ticket.id).values_list("kind", flat=True))
    assert kinds == ["admitted"]


def test_a_worker_event_cannot_be_rewritten_or_deleted(owner_cursor, staff_user, django_user_model):
    """Who stopped a worker consuming, and why, is append-only: the database
    refuses UPDATE and DELETE even to the tables' owner."""
    from runtime import registry
    from runtime.models import WorkerEvent

    registry.register_worker(name="turns@gone", host="gone", pid=1, queues=["turns"], pool_size=1)
    # No such worker process: recorded, unanswered, and the registry unchanged.
    row, answered = runtime_services.set_worker_consuming(
        worker="turns@gone", queue="turns", consume=False, user=staff_user, reason="test"
    )
    assert not answered and row.consuming == ["turns"]
    event = WorkerEvent.objects.get(worker="turns@gone")
    assert event.detail == {"queue": "turns", "reason": "test", "answered": False, "replies": []}
    for statement in (
        "UPDATE runtime_workerevent SET actor = 'someone else' WHERE id = %s",
        "DELETE FROM runtime_workerevent WHERE id = %s",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            owner_cursor.execute(statement, [event.id])
    with pytest.raises(Invalid):
        runtime_services.set_worker_consuming(
            worker="turns@gone", queue="control", consume=False, user=staff_user, reason="x"
        )
    with pytest.raises(Forbidden):
        runtime_services.set_worker_consuming(
            worker="turns@gone",
            queue="turns",
            consume=False,
            user=django_user_model.objects.create_user("plain"),
            reason="x",
        )
