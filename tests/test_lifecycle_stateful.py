"""The ticket, turn, lock and endpoint lifecycle as a Hypothesis state machine.

Real PostgreSQL, real services, no HTTP layer and no worker: the rules call
admission, the runtime (start / heartbeat / finish / interrupt / sweep /
quarantine), cancel and recovery (inspect / decide / lesson) directly, in
any order Hypothesis finds, with right and wrong fencing tokens. Commits are
real (a transactional test), so dispatch publishes go to the test broker on
commit, as in production; nothing consumes them.

The clock is not faked. Each example has a ``fast`` endpoint whose budget
and interrupt grace are a few milliseconds (a rule that needs them spent
polls the real clock until they are) and a ``slow`` one whose budget and
grace are an hour (nothing may time out there during a run).

A small model predicts every outcome; after every step the invariants are
checked against the database itself:

- at most one running or interrupting turn per endpoint;
- the lock's holder is that turn (token = its seq); a held lock with no
  active turn belongs to the uncertain turn of a quarantined endpoint;
- seq is strictly increasing per endpoint (1, 2, 3 ... in start order) and
  ``turn_seq`` is the last one;
- a ticket's result came from its registered turn (each result names the
  turn it was produced for, and the turn's context entry holds it);
- a stale finish, heartbeat or stop changes nothing (checked in the rule);
- a quarantined endpoint has exactly one open case, an available one none;
- a running ticket has a live turn or an open case;
- a ticket's last transition event's ``to_state`` is its state.
"""

from __future__ import annotations

import collections
import itertools
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from core.errors import (
    DedupeConflict,
    EndpointBusy,
    EndpointQuarantined,
    Invalid,
    InvalidTransition,
    StaleTurn,
)
from endpoints.models import Endpoint
from recovery import services as recovery
from recovery.models import RecoveryCase
from runtime import services as runtime_services
from runtime import turns as runtime
from runtime.runners import Outcome
from tests.conftest import purge_broker, wait_for
from tickets.admission import admit_ticket
from tickets.models import (
    TURN_ACTIVE_STATES,
    ContextEntry,
    EndpointLock,
    LedgerEvent,
    Ticket,
    TicketEvent,
    Turn,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

ACTIVE = {str(s) for s in TURN_ACTIVE_STATES}
KEYS = [None, "k0", "k1", "k2"]
FAST = {"turn_budget_s": 0.01, "interrupt_grace_s": 0.01, "heartbeat_timeout_s": 3600}
SLOW = {"turn_budget_s": 3600, "interrupt_grace_s": 3600, "heartbeat_timeout_s": 3600}

_examples = itertools.count()
# What the run reached (printed with -s): a state machine that never reaches
# quarantine or a decision proves little.
REACHED: collections.Counter[str] = collections.Counter()


def event(what: str) -> None:
    REACHED[what] += 1


@dataclass
class MEndpoint:
    name: str
    address: str
    fast: bool
    reject: bool
    state: str = "available"
    holder: uuid.UUID | None = None
    seq: int = 0
    case: uuid.UUID | None = None


@dataclass
class MTicket:
    id: uuid.UUID
    endpoint: str
    key: str | None
    input: dict
    state: str = "queued"
    turn: uuid.UUID | None = None
    cancel_requested: bool = False
    result: Any = None


@dataclass
class MTurn:
    id: uuid.UUID
    endpoint: str
    ticket: uuid.UUID
    seq: int
    state: str = "running"
    # The outcome the turn ended with (kind, payload): the same outcome sent
    # again is a repeat whose first reply was lost, answered as accepted.
    outcome: tuple | None = None


@dataclass
class MCase:
    id: uuid.UUID
    endpoint: str
    ticket: uuid.UUID
    turn: uuid.UUID
    state: str = "open"
    inspections: list[uuid.UUID] = field(default_factory=list)


class Lifecycle(RuleBasedStateMachine):
    owner = None  # set by the test: the accountable owner of every endpoint

    def __init__(self) -> None:
        super().__init__()
        self.n = next(_examples)
        self.eps: dict[str, MEndpoint] = {}
        self.tickets: dict[uuid.UUID, MTicket] = {}
        self.turns: dict[uuid.UUID, MTurn] = {}
        self.cases: dict[uuid.UUID, MCase] = {}
        self.results = itertools.count()

    # --- helpers ----------------------------------------------------------------------------

    def ep(self, address: str) -> MEndpoint:
        return next(e for e in self.eps.values() if e.address == address)

    def by_key(self, address: str, key: str | None) -> MTicket | None:
        if key is None:
            return None
        return next(
            (t for t in self.tickets.values() if t.endpoint == address and t.key == key), None
        )

    def rows(self, address: str) -> dict[str, list[dict]]:
        """Every state-bearing row of one endpoint: what a stale call must not change."""
        return {
            "endpoint": list(Endpoint.objects.filter(address=address).values()),
            "lock": list(EndpointLock.objects.filter(endpoint__address=address).values()),
            "tickets": list(
                Ticket.objects.filter(endpoint__address=address).order_by("id").values()
            ),
            "turns": list(Turn.objects.filter(endpoint__address=address).order_by("seq").values()),
            "cases": list(
                RecoveryCase.objects.filter(endpoint__address=address).order_by("id").values()
            ),
            "context": list(
                ContextEntry.objects.filter(endpoint__address=address).order_by("seq").values()
            ),
        }

    # --- setup ------------------------------------------------------------------------------

    @initialize()
    def endpoints(self) -> None:
        from endpoints.services import create_endpoint

        for name, budgets, reject in (("fast", FAST, False), ("slow", SLOW, True)):
            address = f"fuzz{self.n}.{name}"
            create_endpoint(
                address=address,
                # No process runs these turns (the test drives the runtime itself):
                # inline, so a stop is judged on the grace alone, as modelled.
                runner={"kind": "python", "path": "runtime.demo.echo", "isolation": "inline"},
                owners=[self.owner.username],
                busy_policy="reject" if reject else "enqueue",
                **budgets,
            )
            self.eps[name] = MEndpoint(
                name=name, address=address, fast=name == "fast", reject=reject
            )

    # --- admission --------------------------------------------------------------------------

    @rule(name=st.sampled_from(["fast", "slow"]), key=st.sampled_from(KEYS), n=st.integers(0, 2))
    def admit(self, name: str, key: str | None, n: int) -> None:
        e = self.eps[name]
        value = {"n": n}
        existing = self.by_key(e.address, key)
        # The rule for reject (docs/reference/api.md): 409 while a turn holds the lock or
        # a ticket already waits to start; a reject endpoint never queues two.
        busy = e.reject and (
            e.holder is not None
            or any(t.endpoint == e.address and t.state == "queued" for t in self.tickets.values())
        )
        try:
            admitted = admit_ticket(
                endpoint=e.address,
                input=value,
                dedupe_key=key,
                submitted_by_id=self.owner.id,
                actor="fuzz",
            )
        except DedupeConflict as exc:
            assert existing is not None and existing.input != value
            assert exc.extra["ticket"] == str(existing.id)
            return
        except EndpointQuarantined as exc:
            assert existing is None and e.state == "quarantined"
            assert exc.extra["case"] == str(e.case)
            return
        except EndpointBusy:
            assert existing is None and e.state == "available" and busy
            return
        if existing is not None:
            # A duplicate finds the original whatever its state, quarantine included.
            assert existing.input == value
            assert admitted.duplicate and admitted.ticket.id == existing.id
            return
        assert not admitted.duplicate
        assert e.state == "available" and not busy, "admitted where it must fail closed"
        self.tickets[admitted.ticket.id] = MTicket(
            id=admitted.ticket.id, endpoint=e.address, key=key, input=value
        )

    # --- the turn runtime -------------------------------------------------------------------

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def start(self, data) -> None:
        """A dispatch message for some ticket: the worker starts the endpoint's
        oldest queued ticket, or does nothing."""
        every = sorted(self.tickets.values(), key=lambda x: x.id)
        waiting = [x for x in every if x.state == "queued"]
        if waiting and data.draw(st.integers(0, 2), label="prefer queued") > 0:
            t = data.draw(st.sampled_from(waiting), label="queued ticket")
        else:
            t = data.draw(st.sampled_from(every), label="ticket")
        e = self.ep(t.endpoint)
        queued = [x for x in waiting if x.endpoint == e.address]
        started = runtime.start_turn(ticket_id=t.id)
        event(f"start: ticket {t.state}, lock {'held' if e.holder else 'free'}, {e.state}")
        if t.state != "queued" or e.holder is not None or e.state != "available":
            assert started is None, f"started a turn for a {t.state} ticket or a held lock"
            return
        assert started is not None
        oldest = queued[0]
        assert started.ticket.id == oldest.id, "FIFO per endpoint: the oldest queued starts"
        assert started.turn.seq == e.seq + 1, "the fencing token is ++turn_seq"
        e.seq += 1
        e.holder = started.turn.id
        oldest.state, oldest.turn = "running", started.turn.id
        self.turns[started.turn.id] = MTurn(
            id=started.turn.id, endpoint=e.address, ticket=oldest.id, seq=started.turn.seq
        )

    def _pick_turn(self, data) -> MTurn:
        """Any turn, most often a live one (ended turns only test staleness)."""
        every = sorted(self.turns.values(), key=lambda x: x.id)
        live = [x for x in every if x.state in ACTIVE]
        if live and data.draw(st.integers(0, 2), label="prefer live") > 0:
            return data.draw(st.sampled_from(live), label="live turn")
        return data.draw(st.sampled_from(every), label="turn")

    def _draw_seq(self, data, turn: MTurn, wrong: bool) -> int:
        if not wrong:
            return turn.seq
        e = self.ep(turn.endpoint)
        choices = sorted({turn.seq - 1, turn.seq + 1, e.seq, 0} - {turn.seq})
        return data.draw(st.sampled_from(choices))

    @precondition(lambda self: self.turns)
    @rule(data=st.data(), wrong=st.booleans(), strict=st.booleans())
    def heartbeat(self, data, wrong: bool, strict: bool) -> None:
        turn = self._pick_turn(data)
        seq = self._draw_seq(data, turn, wrong)
        current = turn.state in ACTIVE and seq == turn.seq
        before = Turn.objects.get(id=turn.id).heartbeat_at
        if strict and not current:
            rows = self.rows(turn.endpoint)
            with pytest.raises(StaleTurn):
                runtime.heartbeat(turn_id=turn.id, seq=seq, source="fuzz", strict=True)
            assert self.rows(turn.endpoint) == rows, "a stale heartbeat changed the ledger"
            return
        beat = runtime.heartbeat(turn_id=turn.id, seq=seq, source="fuzz", strict=strict)
        assert beat.current == current
        after = Turn.objects.get(id=turn.id).heartbeat_at
        if current:
            assert beat.interrupted == (turn.state == "interrupting")
            assert after >= before
        else:
            assert after == before

    @precondition(lambda self: self.turns)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["success", "failure", "stopped"]),
        wrong=st.booleans(),
    )
    def finish(self, data, kind: str, wrong: bool) -> None:
        """An outcome for some turn, with its own seq or a wrong one: only the
        exact, active turn's outcome counts."""
        turn = self._pick_turn(data)
        seq = self._draw_seq(data, turn, wrong)
        e, t = self.ep(turn.endpoint), self.tickets[turn.ticket]
        # Each result names the turn it was produced for: the invariant then
        # proves a ticket's result came from its registered turn.
        result = {"by": str(turn.id), "n": next(self.results)}
        outcome = {
            "success": lambda: Outcome.success(result),
            "failure": lambda: Outcome.failure({"code": "boom", "by": str(turn.id)}),
            "stopped": lambda: Outcome.stopped("fuzz_exit", {"by": str(turn.id)}),
        }[kind]()
        exact = (
            seq == turn.seq and turn.state in ACTIVE and t.turn == turn.id and e.holder == turn.id
        )
        payload = {"success": result, "failure": {"code": "boom"}, "stopped": "fuzz_exit"}[kind]
        repeat = not exact and seq == turn.seq and turn.outcome == (kind, repr(payload))
        rows = self.rows(e.address)
        stale_before = TicketEvent.objects.filter(ticket_id=t.id, kind="stale_outcome").count()
        if not exact and not repeat and data.draw(st.booleans(), label="strict"):
            with pytest.raises(StaleTurn):
                runtime.finish_turn(
                    turn_id=turn.id, seq=seq, outcome=outcome, source="fuzz", strict=True
                )
            finished = None
        else:
            finished = runtime.finish_turn(turn_id=turn.id, seq=seq, outcome=outcome, source="fuzz")
        event(f"finish: {'exact' if exact else 'stale'} {kind} on a {turn.state} turn")
        if repeat:
            # The turn's own outcome again (its first reply lost in a blip):
            # accepted as a duplicate, and nothing is written.
            assert finished is not None and finished.accepted and finished.duplicate
            assert finished.ticket_state == t.state
            assert self.rows(e.address) == rows, "a repeated finish changed the ledger"
            return
        if not exact:
            assert finished is None or not finished.accepted
            assert self.rows(e.address) == rows, "a stale finish changed the ledger"
            stale_after = TicketEvent.objects.filter(ticket_id=t.id, kind="stale_outcome").count()
            assert stale_after == stale_before + 1, "a stale finish must be kept as evidence"
            return
        assert finished.accepted and not finished.duplicate
        turn.outcome = (kind, repr(payload))
        if turn.state == "interrupting" or kind == "stopped":
            turn.state = "stopped"
            t.state = "cancelled" if t.cancel_requested else "failed"
        elif kind == "success":
            turn.state, t.state, t.result = "completed", "succeeded", result
        else:
            turn.state, t.state = "failed", "failed"
        assert finished.ticket_state == t.state
        e.holder = None

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def cancel(self, data) -> None:
        t = data.draw(st.sampled_from(sorted(self.tickets.values(), key=lambda x: x.id)))
        if t.state not in ("queued", "running"):  # waiting is not reached by these rules
            with pytest.raises(InvalidTransition):
                runtime_services.cancel_ticket(ticket_id=t.id, actor="fuzz")
            return
        runtime_services.cancel_ticket(ticket_id=t.id, actor="fuzz")
        if t.state == "queued":
            t.state = "cancelled"
            return
        # Running: an interrupt of the exact turn; the state moves when it stops.
        turn = self.turns[t.turn]
        if not t.cancel_requested and turn.state == "running":
            turn.state = "interrupting"
        t.cancel_requested = True

    @precondition(lambda self: self.turns)
    @rule(data=st.data())
    def interrupt(self, data) -> None:
        """A timeout's interrupt request for one exact turn (what the sweep does)."""
        turn = self._pick_turn(data)
        asked = runtime.request_interrupt(turn_id=turn.id, reason="deadline", actor="fuzz")
        assert asked == (turn.state == "running")
        if asked:
            turn.state = "interrupting"

    def _spent(self, turn: MTurn) -> None:
        """Poll the real clock until the fast endpoint's budget or grace for
        this turn has run out (milliseconds)."""
        row = Turn.objects.select_related("endpoint").get(id=turn.id)
        if row.state == "running":
            until = row.deadline_at
        else:
            until = row.interrupt_requested_at + timedelta(seconds=row.endpoint.interrupt_grace_s)
        wait_for(lambda: timezone.now() > until, timeout=5, interval=0.002, message="the budget")

    @rule()
    def sweep(self) -> None:
        """The budget sweep, as beat runs it: fast turns are past their budget
        (or grace) by the time it reads the clock, slow ones an hour short."""
        active = [x for x in self.turns.values() if x.state in ACTIVE]
        for turn in active:
            if self.ep(turn.endpoint).fast:
                self._spent(turn)
        report = runtime.sweep_budgets()
        assert not report.skipped
        for turn in active:
            e, t = self.ep(turn.endpoint), self.tickets[turn.ticket]
            if not e.fast:
                continue
            if turn.state == "running":
                assert turn.id in report.interrupted
                turn.state = "interrupting"
            else:
                self._quarantined(turn, e, t, set(report.quarantined))

    def _quarantined(self, turn: MTurn, e: MEndpoint, t: MTicket, case_ids) -> None:
        event("quarantined")
        case = RecoveryCase.objects.get(turn_id=turn.id)
        assert case.id in case_ids
        turn.state, t.state, e.state, e.case = "uncertain", "recovering", "quarantined", case.id
        self.cases[case.id] = MCase(id=case.id, endpoint=e.address, ticket=t.id, turn=turn.id)

    @precondition(lambda self: self.turns)
    @rule(data=st.data())
    def quarantine(self, data) -> None:
        turn = self._pick_turn(data)
        e, t = self.ep(turn.endpoint), self.tickets[turn.ticket]
        if turn.state == "interrupting" and e.fast:
            self._spent(turn)
        rows = self.rows(e.address)
        case_id = runtime.quarantine_turn(turn_id=turn.id)
        if turn.state == "interrupting" and e.fast:
            assert case_id is not None
            event("quarantine: by the rule")
            self._quarantined(turn, e, t, {case_id})
        else:
            # Not interrupting, or an hour of grace left: too early, nothing changes.
            assert case_id is None
            assert self.rows(e.address) == rows

    # --- recovery ---------------------------------------------------------------------------

    @precondition(lambda self: self.cases)
    @rule(data=st.data())
    def inspect(self, data) -> None:
        self.inspect_case(
            data.draw(st.sampled_from(sorted(self.cases.values(), key=lambda x: x.id)))
        )

    def inspect_case(self, case: MCase) -> None:
        rows = self.rows(case.endpoint)
        inspection = recovery.inspect_case(case_id=case.id, user=self.owner)
        assert self.rows(case.endpoint) == rows, "an inspection changed the ledger"
        case.inspections.append(inspection.id)

    @precondition(lambda self: self.cases)
    @rule(
        data=st.data(),
        action=st.sampled_from(
            ["finalize_orphan", "authorize_rerun", "keep_quarantined", "release"]
        ),
        which=st.sampled_from(["own", "own", "own", "none", "other"]),
        evidence=st.sampled_from(["the worker host was reimaged", "the worker host was gone", ""]),
    )
    def decide(self, data, action: str, which: str, evidence: str) -> None:
        every = sorted(self.cases.values(), key=lambda x: x.id)
        still_open = [c for c in every if c.state == "open"]
        if still_open and data.draw(st.integers(0, 2), label="prefer open") > 0:
            case = data.draw(st.sampled_from(still_open), label="open case")
        else:
            case = data.draw(st.sampled_from(every), label="case")
        if which == "own" and not case.inspections:
            self.inspect_case(case)  # an owner inspects, then decides on what they saw
        others = [i for c in every if c is not case for i in c.inspections]
        inspection = {
            "own": case.inspections[-1] if case.inspections else None,
            "none": None,
            "other": others[0] if others else None,
        }[which]
        rows = self.rows(case.endpoint)
        call = dict(
            case_id=case.id,
            user=self.owner,
            action=action,
            inspection_id=inspection,
            rationale="fuzz",
            evidence=evidence,
        )
        if (action == "release" and not evidence) or inspection not in case.inspections:
            event("decide: refused, invalid")
            with pytest.raises(Invalid):
                recovery.decide(**call)
            assert self.rows(case.endpoint) == rows
            return
        if case.state != "open":
            event("decide: refused, case not open")
            with pytest.raises(InvalidTransition):
                recovery.decide(**call)
            assert self.rows(case.endpoint) == rows
            return
        decision = recovery.decide(**call)
        event(f"decide: {action}")
        if action == "keep_quarantined":
            assert self.rows(case.endpoint) == rows, "keep_quarantined changed the ledger"
            return
        e, t, turn = self.ep(case.endpoint), self.tickets[case.ticket], self.turns[case.turn]
        case.state, e.state, e.case, e.holder = "decided", "available", None, None
        if action == "release":
            turn.state, t.state = "stopped", "failed"
            return
        turn.state, t.state = "unresolved", "orphaned"
        if action == "authorize_rerun":
            rerun = decision.rerun_ticket
            assert rerun is not None and rerun.parent_id == t.id and rerun.state == "queued"
            assert rerun.dedupe_key == recovery.rerun_key(t.key or str(t.id), 1)
            self.tickets[rerun.id] = MTicket(
                id=rerun.id, endpoint=e.address, key=rerun.dedupe_key, input=t.input
            )

    @precondition(lambda self: self.cases)
    @rule(data=st.data())
    def lesson(self, data) -> None:
        case = data.draw(st.sampled_from(sorted(self.cases.values(), key=lambda x: x.id)))
        call = dict(case_id=case.id, user=self.owner, what_failed="x", evidence="y", prevention="z")
        if case.state != "decided":
            with pytest.raises(InvalidTransition):
                recovery.write_lesson(**call)
            return
        recovery.write_lesson(**call)
        case.state = "closed"

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def model_matches_the_ledger(self) -> None:
        event("steps")
        addresses = [e.address for e in self.eps.values()]
        endpoints = {
            row["address"]: row
            for row in Endpoint.objects.filter(address__in=addresses).values(
                "address", "state", "turn_seq", "lock__holder_id"
            )
        }
        for e in self.eps.values():
            row = endpoints[e.address]
            assert (row["state"], row["lock__holder_id"], row["turn_seq"]) == (
                e.state,
                e.holder,
                e.seq,
            ), f"endpoint {e}"
        tickets = {
            row["id"]: row
            for row in Ticket.objects.filter(id__in=list(self.tickets)).values(
                "id", "state", "turn_id", "result"
            )
        }
        for t in self.tickets.values():
            row = tickets[t.id]
            assert (row["state"], row["turn_id"], row["result"]) == (t.state, t.turn, t.result), (
                f"ticket {t}"
            )
        turns = dict(Turn.objects.filter(id__in=list(self.turns)).values_list("id", "state"))
        assert turns == {x.id: x.state for x in self.turns.values()}
        cases = dict(
            RecoveryCase.objects.filter(id__in=list(self.cases)).values_list("id", "state")
        )
        assert cases == {x.id: x.state for x in self.cases.values()}

    @invariant()
    def ledger_invariants(self) -> None:
        addresses = [e.address for e in self.eps.values()]
        all_turns = list(Turn.objects.filter(endpoint__address__in=addresses).order_by("seq"))
        open_cases = list(
            RecoveryCase.objects.filter(endpoint__address__in=addresses, state="open").values_list(
                "endpoint_id", "ticket_id"
            )
        )
        for endpoint in Endpoint.objects.filter(address__in=addresses).select_related("lock"):
            lock = endpoint.lock
            turns = [x for x in all_turns if x.endpoint_id == endpoint.id]
            active = [x for x in turns if x.state in ACTIVE]
            # At most one running or interrupting turn per endpoint.
            assert len(active) <= 1, f"{len(active)} active turns on {endpoint.address}"
            # The lock's holder is the active turn, and its token that turn's seq.
            if active:
                assert lock.holder_id == active[0].id and lock.token == active[0].seq
            elif lock.holder_id is not None:
                holder = next(x for x in turns if x.id == lock.holder_id)
                assert holder.state == "uncertain" and endpoint.state == "quarantined"
                assert lock.token == holder.seq
            # seq strictly increasing in start order, no gaps, turn_seq the last.
            assert [x.seq for x in turns] == list(range(1, len(turns) + 1))
            assert all(a.started_at <= b.started_at for a, b in itertools.pairwise(turns))
            assert endpoint.turn_seq == len(turns)
            # Quarantined <=> exactly one open case.
            cases = sum(1 for ep, _ in open_cases if ep == endpoint.id)
            assert cases == (1 if endpoint.state == "quarantined" else 0), endpoint.address

        turns_by_id = {x.id: x for x in all_turns}
        entries = dict(
            ContextEntry.objects.filter(endpoint__address__in=addresses).values_list(
                "turn_id", "result"
            )
        )
        # The last transition event of each ticket (PostgreSQL's DISTINCT ON).
        last_events = dict(
            LedgerEvent.objects.filter(ticket__endpoint__address__in=addresses)
            .exclude(to_state="")
            .order_by("ticket_id", "-id")
            .distinct("ticket_id")
            .values_list("ticket_id", "to_state")
        )
        tickets = Ticket.objects.filter(endpoint__address__in=addresses).values(
            "id", "state", "turn_id", "result"
        )
        for ticket in tickets:
            tid, state, turn = ticket["id"], ticket["state"], turns_by_id.get(ticket["turn_id"])
            # A result came from the ticket's registered turn.
            if ticket["result"] is not None or state == "succeeded":
                assert state == "succeeded" and ticket["result"] is not None
                assert turn is not None and turn.ticket_id == tid and turn.state == "completed"
                assert ticket["result"]["by"] == str(turn.id)
                assert entries[turn.id] == ticket["result"]
            # A running ticket has a live turn or an open case.
            if state == "running":
                live = turn is not None and turn.state in ACTIVE
                assert live or any(t == tid for _, t in open_cases), f"ticket {tid}"
            if state == "recovering":
                assert turn.state == "uncertain" and any(t == tid for _, t in open_cases)
            # The last transition event's to_state is the ticket's state.
            assert last_events[tid] == state, f"ticket {tid}: last event {last_events[tid]}"


def test_lifecycle_state_machine(django_user_model):
    Lifecycle.owner = django_user_model.objects.create_user("fuzz-owner")
    try:
        run_state_machine_as_test(
            Lifecycle,
            settings=settings(
                max_examples=15,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        purge_broker()  # the dispatches no worker took
        print(*sorted(REACHED.items()), sep="\n")  # what the run reached (pytest -s)
