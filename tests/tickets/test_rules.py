"""The rules the PL/pgSQL functions and the Python services share, each one
SQL function (tickets/sql/) that Python reads through tickets/rules.py:
"may start" (an endpoint available and not paused) and "who may see a
ticket"; and the rules only the database applies, each in one function:
"root-like" (a ticket that answers a requester), "owes a delivery", and a
ticket's move with its event (claimcheck_ticket_move and its parts, which
a turn's finish shares). Each test here fails when a second copy of its
rule appears."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection

from core.dispatch import DELIVER
from endpoints.models import Endpoint
from runtime import turns as runtime
from runtime.runners import Outcome
from runtime.services import cancel_ticket, pause_endpoint
from tickets.admission import admit_ticket
from tickets.models import TERMINAL_STATES
from tickets.rules import EndpointMayStart

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("state", "paused", "may"),
    [("available", False, True), ("available", True, False), ("quarantined", False, False)],
)
def test_may_start_is_one_function(state, paused, may):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT claimcheck_endpoint_may_start(p_state => %s,"
            " p_paused_at => CASE WHEN %s THEN now() END)",
            [state, paused],
        )
        assert cur.fetchone() == (may,)


def test_python_reads_may_start_from_the_function_and_it_is_inlined(make_endpoint, staff_user):
    make_endpoint("rules.open")
    make_endpoint("rules.paused")
    pause_endpoint(address="rules.paused", user=staff_user, reason="a rule's test")
    ours = Endpoint.objects.filter(address__startswith="rules.")
    may = ours.alias(ok=EndpointMayStart()).filter(ok=True)
    assert list(may.values_list("address", flat=True)) == ["rules.open"]
    sql, params = may.query.sql_with_params()
    assert "claimcheck_endpoint_may_start(p_state => " in sql
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (VERBOSE) " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    # Inlined: the planner sees the columns, not a call.
    assert "claimcheck_endpoint_may_start" not in plan and "paused_at IS NULL" in plan, plan


def test_a_cancel_writes_one_error_text_whichever_way_it_went(make_endpoint):
    """At once (queued) and once the running turn is proven stopped (the
    finish): the same ``claimcheck_ticket_cancelled_error``."""
    make_endpoint("rules.cancel")
    running = admit_ticket(endpoint="rules.cancel", input={"n": 1}).ticket
    queued = admit_ticket(endpoint="rules.cancel", input={"n": 2}).ticket
    started = runtime.start_turn(ticket_id=running.id)
    assert started is not None and started.ticket.id == running.id
    cancel_ticket(ticket_id=queued.id, actor="user:q")
    cancel_ticket(ticket_id=running.id, actor="user:r")
    runtime.finish_turn(
        turn_id=started.turn.id,
        seq=started.turn.seq,
        outcome=Outcome.stopped("process_exit", {"signals_sent": ["SIGTERM"]}),
        source="test",
    )
    for ticket, actor in ((queued, "user:q"), (running, "user:r")):
        ticket.refresh_from_db()
        assert ticket.state == "cancelled"
        assert ticket.error == {"code": "cancelled", "detail": f"cancelled by {actor}"}


# --- One home each: found by reading the sources --------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
APPS = sorted(
    p.parent for p in ROOT.glob("*/__init__.py") if p.parent.name not in ("tests", "bench")
)


def _sql_files() -> list[Path]:
    return sorted(ROOT.glob("*/sql/*.sql"))


def _py_files() -> list[Path]:
    return sorted(f for app in APPS for f in app.rglob("*.py") if "migrations" not in f.parts)


def _sql(path: Path) -> str:
    """A SQL file without its comments and without its own CREATE line."""
    text = re.sub(r"--[^\n]*", "", path.read_text())
    return re.sub(rf"CREATE OR REPLACE FUNCTION {path.stem}\s*\(", "", text)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _callers(name: str) -> set[str]:
    """The sources that call the function ``name``: a SQL body calling it,
    a Python string naming it (a call's text, or a Func's ``function``)."""
    call = re.compile(rf"\b{name}\s*\(")
    named = re.compile(rf"""["']{name}["']|\b{name}\s*\(""")
    found = {_rel(p) for p in _sql_files() if call.search(_sql(p))}
    for path in _py_files():
        # Only string literals: a docstring or a comment may name a function.
        strings = [
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
        if any(named.search(f'"{text}"' if text == name else text) for text in strings):
            found.add(_rel(path))
    return found


def test_owes_a_delivery_has_one_home():
    """The delivery a terminal ticket owes is opened by one function, which
    both writers of a move call; Python reads neither it nor root-like."""
    assert _callers("claimcheck_open_delivery") == {"tickets/sql/claimcheck_ticket_owes.sql"}
    assert _callers("claimcheck_ticket_owes") == {
        "tickets/sql/claimcheck_ticket_move.sql",
        "tickets/sql/claimcheck_finish_turn.sql",
    }
    assert _callers("claimcheck_ticket_root_like") == {
        "tickets/sql/claimcheck_ticket_owes.sql",
        # An orphan superseded by a re-run passes the obligation it carries.
        "tickets/sql/claimcheck_ticket_move.sql",
    }


def test_the_terminal_states_of_the_sql_are_the_enums():
    for name in ("claimcheck_ticket_owes", "claimcheck_ticket_write"):
        [listed] = re.findall(
            r"p_to (?:NOT )?IN \(([^)]*)\)", _sql(ROOT / f"tickets/sql/{name}.sql")
        )
        assert set(re.findall(r"'(\w+)'", listed)) == set(TERMINAL_STATES), name


def _writes_ticket_state(text: str) -> bool:
    for statement in re.findall(r"UPDATE\s+tickets_ticket\b.*?\bSET\b(.*?)\bWHERE\b", text, re.S):
        if re.search(r"(?<![\w.])state\s*=", statement):
            return True
    return False


def test_a_tickets_move_and_its_event_are_written_in_one_place():
    """The state column is written by one statement (claimcheck_ticket_write,
    with the event), which the Python services reach through
    claimcheck_ticket_move and a turn's finish through its write. The
    start (queued -> running) is its own statement: it owes nothing, and
    takes the lock, starts the turn and moves the ticket in one plan."""
    assert {_rel(p) for p in _sql_files() if _writes_ticket_state(_sql(p))} == {
        "tickets/sql/claimcheck_ticket_write.sql",
        "tickets/sql/claimcheck_start_turn.sql",
    }
    assert _callers("claimcheck_ticket_write") == {
        "tickets/sql/claimcheck_ticket_move.sql",
        "tickets/sql/claimcheck_finish_write.sql",
    }
    assert _callers("claimcheck_ticket_move") == {"tickets/lifecycle.py"}
    # No Python writes a ticket's state, nor an event of a move.
    for path in _py_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                keywords = {k.arg for k in node.keywords}
                if node.func.attr == "update" and "Ticket.objects" in ast.unparse(node.func):
                    assert "state" not in keywords, f"{_rel(path)}: {ast.unparse(node)}"
                if node.func.attr == "create" and "TicketEvent.objects" in ast.unparse(node):
                    assert _rel(path) == "tickets/events.py", _rel(path)


# What a ledger row's state is made of, per model: written only by the
# ledger's services (tickets/), which the runtime calls.
_LEDGER_STATE = {
    "Ticket": {"state"},
    "Turn": {"state", "ended_at", "stop_evidence", "interrupt_requested_at", "interrupt_reason"},
    "EndpointLock": {"holder", "holder_id", "token", "acquired_at"},
}


def _ledger_state_writes(tree: ast.AST) -> list[str]:
    """The ORM writes of a ledger state field in a module: an ``update`` or
    ``update_or_create`` on a ledger model's manager naming one (a
    ``**fields`` may name any), or a ``save`` whose ``update_fields`` do."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        keywords = {k.arg for k in node.keywords}
        if node.func.attr in ("update", "update_or_create", "bulk_update"):
            receiver = ast.unparse(node.func.value)
            for model, fields in _LEDGER_STATE.items():
                if re.search(rf"\b{model}\.objects\b", receiver) and (
                    None in keywords or keywords & fields or node.func.attr == "bulk_update"
                ):
                    found.append(ast.unparse(node))
        elif node.func.attr == "save":
            named = {
                e.value
                for k in node.keywords
                if k.arg == "update_fields"
                for e in ast.walk(k.value)
                if isinstance(e, ast.Constant)
            }
            if None in keywords or named & set().union(*_LEDGER_STATE.values()):
                found.append(ast.unparse(node))
    return found


def test_only_the_ledger_writes_a_ledger_rows_state():
    """A ticket's, a turn's and the endpoint lock's state change through the
    ledger's services (tickets/: lifecycle, tickets/turns/); the runtime and
    the apps above it call them and never write those fields through the
    ORM (a heartbeat's ``heartbeat_at`` is not state)."""
    writes = {
        _rel(path): found
        for path in _py_files()
        if path.relative_to(ROOT).parts[0] != "tickets"
        for found in [_ledger_state_writes(ast.parse(path.read_text()))]
        if found
    }
    assert writes == {}


def test_the_ledger_state_check_sees_a_write():
    """The check above would see the writes it forbids."""
    source = """
Turn.objects.filter(id=t).update(state=TurnState.UNCERTAIN)
EndpointLock.objects.filter(endpoint_id=e).update(holder=None, token=None)
Turn.objects.filter(id=t).update(**fields)
ticket.save(update_fields=["state", "updated_at"])
Turn.objects.filter(id=t).update(heartbeat_at=now)
"""
    assert len(_ledger_state_writes(ast.parse(source))) == 4


# Who may see a ticket: its submitter, its endpoint's owners, staff.
@pytest.mark.parametrize(
    ("submitted_by", "endpoint", "owned", "visible"),
    [
        (7, 1, [], True),  # the submitter
        (8, 1, [], False),  # someone else's, on an endpoint not owned
        (8, 1, [1, 2], True),  # an owner of its endpoint
        (8, 3, [1, 2], False),
        (None, 1, None, True),  # staff: every ticket
    ],
)
def test_who_may_see_a_ticket_is_one_function(submitted_by, endpoint, owned, visible):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT claimcheck_ticket_visible(p_submitted_by => %s::integer,"
            " p_endpoint => %s::bigint, p_user => 7, p_owned => %s::bigint[])",
            [submitted_by, endpoint, owned],
        )
        assert bool(cur.fetchone()[0]) is visible


# The code that compares a ticket's submitter with a user for another right
# than seeing it.
NOT_VISIBILITY = {
    "tickets/retry.py",  # who may retry: the submitter or an owner
    "console/selectors/tickets.py",  # the retry button: the same right
}


def test_who_may_see_a_ticket_has_one_home():
    """Python filters with the function (tickets/rules.py Visible, in
    visible_tickets), and admission's statements answer with it; no other
    source compares a ticket's submitter or endpoint with a user."""
    assert _callers("claimcheck_ticket_visible") == {
        "tickets/rules.py",
        "tickets/sql/claimcheck_admit_existing.sql",
        "tickets/sql/claimcheck_admit_moved.sql",
    }
    compares = re.compile(
        r"submitted_by(_id)?\s*==\s*(user|submitter|request)"
        r"|submitted_by(_id)?\s*=\s*(user|request)\b|Q\(\s*submitted_by(_id)?\s*="
    )
    copies = {_rel(p) for p in _py_files() if compares.search(p.read_text())}
    assert copies == NOT_VISIBILITY
    column = re.compile(r"\bsubmitted_by_id\s*(=|<>|IN\b)", re.I)
    assert {_rel(p) for p in _sql_files() if column.search(_sql(p))} == set()


def _verbose_plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")  # small tables: see the index
        cur.execute(f"EXPLAIN (VERBOSE) {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_the_visibility_filter_is_inlined_and_keeps_its_index_plans(
    django_user_model, make_endpoint, staff_user
):
    from tickets.selectors import visible_tickets

    alice = django_user_model.objects.create_user("alice")
    olive = django_user_model.objects.create_user("olive")
    make_endpoint("rules.seen", owners=["olive"])
    mine = admit_ticket(endpoint="rules.seen", input={"n": 1}, submitter=alice).ticket
    other = admit_ticket(endpoint="rules.seen", input={"n": 2}).ticket
    assert list(visible_tickets(alice).values_list("id", flat=True)) == [mine.id]
    assert set(visible_tickets(olive).values_list("id", flat=True)) == {mine.id, other.id}

    nothing_owned = _verbose_plan(visible_tickets(alice).order_by("-id")[:51])
    owner = _verbose_plan(visible_tickets(olive).order_by("-id")[:51])
    staff = _verbose_plan(visible_tickets(staff_user).order_by("-id")[:51])
    for plan in (nothing_owned, owner, staff):
        # Inlined: the planner sees the columns, not a call.
        assert "claimcheck_ticket_visible" not in plan, plan
    assert "ticket_submitter_id_idx" in nothing_owned, nothing_owned
    assert "endpoint_id = ANY" in owner and "submitted_by_id = " in owner, owner
    conditions = [line for line in staff.splitlines() if "Filter:" in line or "Cond:" in line]
    assert conditions == [], staff  # staff: no filter at all


# --- A move by a Python service and by a turn's finish: the same duties ---------------------

ERROR = {"code": "boom", "detail": "the runner failed"}


def _running(address: str, **admit):
    ticket = admit_ticket(endpoint=address, input={"n": address}, **admit).ticket
    started = runtime.start_turn(ticket_id=ticket.id)
    assert started is not None and started.ticket.id == ticket.id
    return started.turn


def _owed(ticket_id) -> dict:
    """Everything a move wrote of a ticket and what it owes, with what
    differs by nature between the two writers left out (ids, times, the
    finish's outcome digest)."""
    from tickets.models import Callback, Delivery, Ticket, TicketEvent

    ticket = Ticket.objects.get(id=ticket_id)
    move = TicketEvent.objects.get(ticket_id=ticket_id, kind="turn_failed")
    detail = {k: v for k, v in move.detail.items() if k != "outcome_sha256"}
    delivery = Delivery.objects.filter(ticket_id=ticket_id).first()
    callback = Callback.objects.filter(source_id=ticket_id).select_related("ticket").first()
    return {
        "ticket": (ticket.state, ticket.error, ticket.delivery_state, ticket.callback_state),
        "finished": ticket.finished_at is not None and ticket.finished_at == move.at,
        "event": (move.from_state, move.to_state, move.actor.split(":")[0], detail),
        "turn": move.turn_id == ticket.turn_id,
        "events": list(
            TicketEvent.objects.filter(ticket_id=ticket_id).order_by("id").values_list("kind")
        ),
        "delivery": delivery
        and (delivery.mode, delivery.url, delivery.next_attempt_at is not None),
        "callback": callback and (callback.ticket.state, callback.ticket.parent_id == ticket_id),
    }


@pytest.mark.parametrize(
    "case", ["a root with a webhook", "a root pulled", "a child that reports", "a child"]
)
def test_a_python_move_and_a_finish_write_the_same_event_and_owe_the_same(
    case, make_endpoint, monkeypatch
):
    """The same terminal edge (running -> failed) written by the finish of a
    turn and by ``lifecycle.transition``: the same ticket, the same event
    (its delivery recorded), the same delivery, the same callback, the same
    publishes -- the duties are done once, for both."""
    from tickets import lifecycle, terminal

    published = []
    monkeypatch.setattr(terminal, "publish", lambda *a: published.append(a[0]))
    make_endpoint("rules.home")
    admit = {}
    if case == "a root with a webhook":
        admit["requester"] = {"webhook_url": "http://127.0.0.1:9/hook"}
    if case.startswith("a child"):
        admit["parent_id"] = admit_ticket(endpoint="rules.home", input={}).ticket.id
        if case == "a child that reports":
            admit["return_to"] = "rules.home"
    owed = []
    for path in ("finish", "transition"):
        make_endpoint(f"rules.{path}")
        turn = _running(f"rules.{path}", **admit)
        if path == "finish":
            runtime.finish_turn(
                turn_id=turn.id, seq=turn.seq, outcome=Outcome.failure(ERROR), source="test"
            )
        else:
            lifecycle.transition(
                ticket_id=turn.ticket_id,
                expected="running",
                to="failed",
                kind="turn_failed",
                actor=f"turn:{turn.seq}:test",
                turn_id=turn.id,
                error=ERROR,
            )
        owed.append(_owed(turn.ticket_id))
    finished, moved = owed
    assert finished == moved
    assert finished["ticket"][:2] == ("failed", ERROR)
    if case == "a root with a webhook":
        assert finished["delivery"][:2] == ("webhook", "http://127.0.0.1:9/hook")
        assert finished["event"][3] == {"delivery_opened": {"mode": "webhook", "state": "pending"}}
        assert published == [DELIVER, DELIVER]
    elif case == "a root pulled":
        assert finished["delivery"][0] == "pull" and published == []
    else:
        assert finished["delivery"] is None and finished["event"][3] == {}
    assert (finished["callback"] is not None) == (case == "a child that reports")
