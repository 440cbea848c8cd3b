"""Endpoint generations: every change of the behaviour-defining fields is
generation N+1 (who, why, diff), conditional on N; turns record the
generation they ran under; proposals and reviews govern owners' changes."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import DatabaseError, connection

from core.errors import InvalidTransition, NotFound, SecondPersonRequired, StaleGeneration
from endpoints import proposals, services
from endpoints.generation_selectors import proposal_payload, side_by_side
from endpoints.models import (
    ChangeProposal,
    ChangeReview,
    Endpoint,
    EndpointGeneration,
    RouteGeneration,
)
from runtime import turns as runtime
from runtime.runners import Outcome
from runtime.turns.execute import run_ticket
from tickets.admission import admit_ticket
from tickets.models import Ticket

ECHO = {"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"}
NOTES = {"kind": "python", "path": "tests.endpoints.notes_runner.echo_notes", "isolation": "inline"}


@pytest.fixture(autouse=True)
def owners(django_user_model):
    return (
        django_user_model.objects.create_user("olive"),
        django_user_model.objects.create_user("oscar"),
    )


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user("mallory")


def _endpoint(address="gen.ep", runner=ECHO, owners=("olive", "oscar"), **kw) -> Endpoint:
    return services.create_endpoint(
        address=address, runner=runner, owners=list(owners), actor="test", **kw
    )


def _admit(endpoint: Endpoint, key: str | None = None, address: str | None = None) -> Ticket:
    return admit_ticket(
        endpoint=address or endpoint.address, input={"n": 1}, dedupe_key=key, actor="test"
    ).ticket


# --- Generations ------------------------------------------------------------------------


def test_an_endpoint_starts_at_generation_one_with_its_configuration(db):
    endpoint = _endpoint(turn_budget_s=60)
    first = EndpointGeneration.objects.get(endpoint=endpoint)
    assert (endpoint.generation, first.number, first.changes) == (1, 1, {})
    assert first.config == {
        "runner": ECHO,
        "turn_budget_s": 60,
        "interrupt_grace_s": 10.0,
        "heartbeat_timeout_s": 30.0,
        "busy_policy": "enqueue",
        "requires_approval": False,
        "notes": "",
    }


def test_a_patch_is_the_next_generation_with_who_why_and_the_diff(api, db):
    _endpoint()
    resp = api.patch("/endpoints/gen.ep", {"turn_budget_s": 42, "reason": "runs are short"})
    assert resp.status_code == 200, resp.content
    assert resp.json()["generation"] == 2
    second = EndpointGeneration.objects.get(endpoint__address="gen.ep", number=2)
    assert second.changes == {"turn_budget_s": {"from": 300.0, "to": 42}}
    assert (second.actor, second.reason) == ("user:staff", "runs are short")
    assert second.config["turn_budget_s"] == 42
    # The same value again is no change and no generation.
    assert api.patch("/endpoints/gen.ep", {"turn_budget_s": 42}).json()["generation"] == 2
    # Made against generation 1, it is refused, with what changed since.
    stale = api.patch("/endpoints/gen.ep", {"turn_budget_s": 50, "generation": 1})
    assert stale.status_code == 409
    body = stale.json()
    assert body["error"] == "stale_generation" and body["generation"] == 2
    assert body["since"] == {"turn_budget_s": {"from": 300.0, "to": 42}}
    assert Endpoint.objects.get(address="gen.ep").turn_budget_s == 42


def test_a_turn_in_flight_keeps_its_generation_and_the_next_starts_under_the_new(db, owners):
    olive, oscar = owners
    endpoint = _endpoint()
    first, second = _admit(endpoint), _admit(endpoint)
    started = runtime.start_turn(ticket_id=first.id)
    assert started.turn.generation == 1
    proposal = proposals.propose_change(
        address="gen.ep",
        user=olive,
        base_generation=1,
        changes={"turn_budget_s": 120},
        reason="give it room",
    )
    review = proposals.review_proposal(
        proposal_id=proposal.id, user=oscar, approve=True, reason="agreed"
    )
    assert review.generation == 2
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.success({"ok": 1}),
        source="worker",
    )
    started.turn.refresh_from_db()
    assert (started.turn.state, started.turn.generation) == ("completed", 1)
    nxt = runtime.start_turn(ticket_id=second.id)
    assert nxt.turn.generation == 2
    assert (nxt.turn.deadline_at - nxt.turn.started_at).total_seconds() == pytest.approx(120)
    # Outcomes per generation, side by side: the one before has the finished turn.
    current, before = side_by_side(Endpoint.objects.get(id=endpoint.id))
    assert (current["generation"], current["turns"], current["running"]) == (2, 1, 1)
    assert (before["generation"], before["turns"], before["succeeded"]) == (1, 1, 1)
    assert before["p50_s"] is not None


def test_a_generations_outcomes_read_a_bounded_sample_and_count_every_turn(db, monkeypatch):
    """The endpoint page read every turn of a generation to count how they
    ended, a cost that grew with the generation (bench/console.py): the
    count of turns comes from the seq range, the rest from the newest few."""
    from endpoints import generation_selectors

    endpoint = _endpoint()
    tickets = [_admit(endpoint) for _ in range(3)]
    outcome = [Outcome.failure({"code": "boom"}), Outcome.success({}), Outcome.success({})]
    for ticket, out in zip(tickets, outcome, strict=True):
        started = runtime.start_turn(ticket_id=ticket.id)
        runtime.finish_turn(
            turn_id=started.turn.id, seq=started.turn.seq, outcome=out, source="worker"
        )
    monkeypatch.setattr(generation_selectors, "OUTCOME_SAMPLE", 2)
    (current,) = side_by_side(Endpoint.objects.get(id=endpoint.id))
    # Three turns; the newest two (both succeeded) are the sample.
    assert (current["turns"], current["sampled"]) == (3, 2)
    assert (current["succeeded"], current["failed"]) == (2, 0)
    assert current["p50_s"] is not None


APPEND_ONLY = {
    "endpoints_endpointgeneration": "UPDATE {t} SET reason = 'forged' WHERE id = %s",
    "endpoints_changeproposal": "UPDATE {t} SET reason = 'forged' WHERE id = %s",
    "endpoints_changereview": "UPDATE {t} SET verdict = 'rejected' WHERE id = %s",
    "endpoints_routegeneration": "UPDATE {t} SET endpoint_id = NULL WHERE id = %s",
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("table", sorted(APPEND_ONLY))
@pytest.mark.parametrize("verb", ["update", "delete", "truncate"])
def test_generations_proposals_reviews_and_routes_are_append_only(
    table, verb, owners, owner_cursor
):
    olive, oscar = owners
    _endpoint(aliases=["gen.old"])
    proposal = proposals.propose_change(
        address="gen.ep", user=olive, base_generation=1, changes={"notes": "x"}, reason="r"
    )
    review = proposals.review_proposal(
        proposal_id=proposal.id, user=oscar, approve=True, reason="ok"
    )
    pk = {
        "endpoints_endpointgeneration": EndpointGeneration.objects.get(number=2).id,
        "endpoints_changeproposal": proposal.id,
        "endpoints_changereview": review.id,
        "endpoints_routegeneration": RouteGeneration.objects.get(alias="gen.old").id,
    }[table]
    sql = {
        "update": APPEND_ONLY[table],
        "delete": "DELETE FROM {t} WHERE id = %s",
        "truncate": "TRUNCATE {t} CASCADE",
    }[verb]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute(sql.format(t=table), [pk] if verb != "truncate" else [])
    # The application role has no such privilege at all.
    with (
        pytest.raises(DatabaseError, match="append-only|permission denied"),
        connection.cursor() as cur,
    ):
        cur.execute(sql.format(t=table), [pk] if verb != "truncate" else [])


# --- Proposals and reviews --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_of_two_proposals_against_one_generation_apply_exactly_one(
    django_user_model,
):
    reviewers = [django_user_model.objects.create_user(f"rev{i}") for i in range(2)]
    proposer = django_user_model.objects.create_user("prop")
    _endpoint(owners=[proposer.username, *(r.username for r in reviewers)])
    made = [
        proposals.propose_change(
            address="gen.ep",
            user=proposer,
            base_generation=1,
            changes={"turn_budget_s": budget},
            reason=f"budget {budget}",
        )
        for budget in (100, 200)
    ]
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def approve(i: int) -> None:
        try:
            barrier.wait()
            results[i] = proposals.review_proposal(
                proposal_id=made[i].id, user=reviewers[i], approve=True, reason="yes"
            )
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test reads
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    applied = [r for r in results if isinstance(r, ChangeReview)]
    stale = [r for r in results if isinstance(r, StaleGeneration)]
    assert (len(applied), len(stale)) == (1, 1), results
    endpoint = Endpoint.objects.get(address="gen.ep")
    assert endpoint.generation == 2
    assert list(
        EndpointGeneration.objects.filter(endpoint=endpoint).values_list("number", flat=True)
    ) == [1, 2]
    assert ChangeReview.objects.count() == 1
    winner = applied[0].proposal
    assert endpoint.turn_budget_s == winner.changes["turn_budget_s"]
    # The loser is stale, and its page shows what changed since.
    loser = next(p for p in made if p.id != winner.id)
    body = proposal_payload(ChangeProposal.objects.get(id=loser.id))
    assert body["status"] == "stale"
    assert body["since"] == {
        "turn_budget_s": {"from": 300.0, "to": winner.changes["turn_budget_s"]}
    }


def test_a_proposer_cannot_approve_their_own_change_when_a_second_person_is_required(
    db, owners, settings
):
    olive, oscar = owners
    _endpoint()
    own = proposals.propose_change(
        address="gen.ep", user=olive, base_generation=1, changes={"notes": "n"}, reason="r"
    )
    with pytest.raises(SecondPersonRequired):
        proposals.review_proposal(proposal_id=own.id, user=olive, approve=True, reason="me")
    assert Endpoint.objects.get(address="gen.ep").generation == 1
    assert not ChangeReview.objects.exists()
    # The endpoint's own setting off: the proposer may apply it.
    services.update_endpoint(
        address="gen.ep", changes={"change_requires_second_person": False}, actor="test"
    )
    proposals.review_proposal(proposal_id=own.id, user=olive, approve=True, reason="me")
    assert Endpoint.objects.get(address="gen.ep").generation == 2
    # One review per proposal: a second is refused.
    with pytest.raises(InvalidTransition):
        proposals.review_proposal(proposal_id=own.id, user=oscar, approve=False, reason="late")


def test_the_global_setting_decides_when_the_endpoint_has_none(db, owners, settings):
    olive, _ = owners
    settings.CHANGE_REQUIRES_SECOND_PERSON = False
    _endpoint()
    own = proposals.propose_change(
        address="gen.ep", user=olive, base_generation=1, changes={"notes": "n"}, reason="r"
    )
    assert (
        proposals.review_proposal(
            proposal_id=own.id, user=olive, approve=True, reason="me"
        ).generation
        == 2
    )


def test_a_rejection_changes_nothing_and_a_rollback_restores_an_earlier_generation(db, owners):
    olive, oscar = owners
    _endpoint()
    rejected = proposals.propose_change(
        address="gen.ep",
        user=olive,
        base_generation=1,
        changes={"busy_policy": "reject"},
        reason="r",
    )
    proposals.review_proposal(proposal_id=rejected.id, user=oscar, approve=False, reason="no")
    assert Endpoint.objects.get(address="gen.ep").generation == 1
    change = proposals.propose_change(
        address="gen.ep",
        user=olive,
        base_generation=1,
        changes={"turn_budget_s": 5, "notes": "check the tool"},
        reason="r",
    )
    proposals.review_proposal(proposal_id=change.id, user=oscar, approve=True, reason="ok")
    back = proposals.propose_rollback(
        address="gen.ep", user=oscar, to_generation=1, base_generation=2, reason="worse"
    )
    assert back.changes == {"turn_budget_s": 300.0, "notes": ""}
    proposals.review_proposal(proposal_id=back.id, user=olive, approve=True, reason="yes")
    third = EndpointGeneration.objects.get(endpoint__address="gen.ep", number=3)
    first = EndpointGeneration.objects.get(endpoint__address="gen.ep", number=1)
    assert third.config == first.config and third.restores == 1
    assert third.proposal_id == back.id


def test_strangers_find_no_governance(db, owners, stranger):
    olive, _ = owners
    _endpoint()
    proposal = proposals.propose_change(
        address="gen.ep", user=olive, base_generation=1, changes={"notes": "n"}, reason="r"
    )
    with pytest.raises(NotFound):
        proposals.propose_change(
            address="gen.ep", user=stranger, base_generation=1, changes={"notes": "x"}, reason="r"
        )
    with pytest.raises(NotFound):
        proposals.review_proposal(proposal_id=proposal.id, user=stranger, approve=True, reason="r")
    with pytest.raises(NotFound):
        proposals.visible_proposal(proposal.id, stranger)


# --- Notes for the next run -----------------------------------------------------------


def test_approved_notes_reach_the_next_turns_runner(db, owners):
    olive, oscar = owners
    endpoint = _endpoint(runner=NOTES)
    before = _admit(endpoint)
    run_ticket(ticket_id=before.id)
    before.refresh_from_db()
    assert before.result["notes"] == "" and before.result["generation"] == 1
    proposal = proposals.propose_change(
        address="gen.ep",
        user=olive,
        base_generation=1,
        changes={"notes": "Check the search tool answers before you plan."},
        reason="the last run planned on a dead tool",
    )
    proposals.review_proposal(proposal_id=proposal.id, user=oscar, approve=True, reason="yes")
    after = _admit(endpoint)
    run_ticket(ticket_id=after.id)
    after.refresh_from_db()
    assert after.result == {
        "notes": "Check the search tool answers before you plan.",
        "generation": 2,
        "envelope_notes": "Check the search tool answers before you plan.",
        "envelope_generation": 2,
    }


def test_run_time_figures_count_only_turns_with_a_known_end(db, owners, api):
    """An unresolved turn's ended_at is the owner's decision, not its end:
    the generations table, "Did it help?" and the API leave it out of
    p50/p95 (it is counted apart, as quarantined)."""
    from recovery import services as recovery
    from tests.conftest import wait_for
    from tests.recovery.conftest import drive_to_quarantine
    from tickets.models import Turn

    olive, _ = owners
    endpoint = _endpoint(interrupt_grace_s=0.5)
    lost = drive_to_quarantine(_admit(endpoint).id)
    inspection = recovery.inspect_case(case_id=lost.case.id, user=olive)
    recovery.decide(
        case_id=lost.case.id,
        user=olive,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="nobody knows when it ended",
    )
    # Decided 60 s after it started: fabricated time only (a test does not
    # wait a minute); its state and end are the decision's.
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runtime_turn SET started_at = ended_at - interval '60 seconds' WHERE id = %s",
            [lost.turn.id],
        )
    unresolved = Turn.objects.get(id=lost.turn.id)
    assert unresolved.state == "unresolved"
    assert (unresolved.ended_at - unresolved.started_at).total_seconds() == 60
    for _ in range(2):
        # A turn that runs 2 s by the database's clock (which stamps both
        # ends), then reports its success.
        started = runtime.start_turn(ticket_id=_admit(endpoint).id)
        wait_for(
            lambda started=started: _db_seconds_since(started.turn.started_at) >= 2,
            timeout=10,
            interval=0.05,
            message="the turn to have run 2 s",
        )
        runtime.finish_turn(
            turn_id=started.turn.id,
            seq=started.turn.seq,
            outcome=Outcome.success({"ran": "2 s"}),
            source="worker",
        )
    (current,) = side_by_side(Endpoint.objects.get(id=endpoint.id))
    assert (current["sampled"], current["succeeded"], current["quarantined"]) == (3, 2, 1)
    assert 2 <= current["p50_s"] < 5 and 2 <= current["p95_s"] < 5, current
    assert current["measured"] == 2
    # The API's generations (and a proposal's "Did it help?") read the same.
    [listed] = api.get(f"/endpoints/{endpoint.address}/generations").json()["outcomes"]
    assert listed == current


def _db_seconds_since(moment) -> float:
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp() - %s)", [moment])
        return float(cur.fetchone()[0])
