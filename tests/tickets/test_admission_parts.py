"""Admission's parts (tickets/sql/claimcheck_admit_v2.sql and the files it
names), each called directly, and what a lean admission writes: a root that
opens its own trace writes no trace row until a second ticket joins it,
which then counts both."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from core.errors import CircuitOpen
from endpoints import services as directory
from tickets import budgets, traces
from tickets.admission import admit_ticket
from tickets.models import LedgerEvent, Ticket, TicketEvent, Trace

pytestmark = pytest.mark.django_db


def call(sql: str, params: dict) -> list[dict]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        names = [c.name for c in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_a_root_opening_its_own_trace_writes_its_row_and_event_only(make_endpoint):
    make_endpoint("lean.echo")
    root = admit_ticket(endpoint="lean.echo", input={"a": 1}, dedupe_key="k").ticket
    assert root.trace_id == root.id.hex
    assert not Trace.objects.filter(id=root.trace_id).exists()
    assert list(LedgerEvent.objects.filter(ticket=root).values_list("kind", flat=True)) == [
        "admitted"
    ]
    assert traces.counted(root.trace_id) == 1


def test_a_second_ticket_starts_the_row_counting_the_first(make_endpoint):
    make_endpoint("lean.echo")
    user = get_user_model().objects.create_user("lena")
    root = admit_ticket(endpoint="lean.echo", input={}, submitted_by_id=user.id).ticket
    child = admit_ticket(endpoint="lean.echo", input={}, parent_id=root.id).ticket
    trace = Trace.objects.get(id=root.trace_id)
    # The child counts for the root's party (the nearest submitter up).
    assert (trace.tickets, trace.parties, trace.max_depth) == (2, {str(user.id): 2}, 1)
    # The trace began with its root (the wall-clock budget counts from there).
    assert trace.created_at == Ticket.objects.get(id=root.id).created_at
    joined = admit_ticket(endpoint="lean.echo", input={}, trace_id=root.trace_id).ticket
    assert joined.trace_id == root.trace_id and child.trace_id == root.trace_id
    trace.refresh_from_db()
    assert (trace.tickets, trace.parties) == (3, {str(user.id): 2, "-": 1})


def test_the_breaker_counts_a_root_that_opened_its_trace_alone(make_endpoint, settings):
    settings.TRACE_HARD_LIMIT = 1
    make_endpoint("lean.echo")
    root = admit_ticket(endpoint="lean.echo", input={}).ticket
    with pytest.raises(CircuitOpen):
        admit_ticket(endpoint="lean.echo", input={}, parent_id=root.id)
    assert not Trace.objects.filter(id=root.trace_id).exists()
    assert Ticket.objects.filter(trace_id=root.trace_id).count() == 1


def test_a_budget_opens_the_row_of_a_root_alone(make_endpoint):
    make_endpoint("lean.echo")
    root = admit_ticket(endpoint="lean.echo", input={}).ticket
    budgets.open_budget(trace_id=root.trace_id, ticket_id=root.id, budget={"tokens": 10})
    trace = Trace.objects.get(id=root.trace_id)
    assert (trace.tickets, trace.parties, trace.budget) == (1, {"-": 1}, {"tokens": 10})
    assert trace.created_at == Ticket.objects.get(id=root.id).created_at


# --- Each part, called directly ----------------------------------------------------------------


def test_trace_opener_names_the_root_alone_and_nothing_else(make_endpoint):
    make_endpoint("lean.echo")
    root = admit_ticket(endpoint="lean.echo", input={}).ticket
    sql = "SELECT * FROM claimcheck_trace_opener(p_trace => %(t)s)"
    [row] = call(sql, {"t": root.trace_id})
    assert (row["o_ticket"], row["o_party"]) == (root.id, "-")
    assert call(sql, {"t": "not-a-uuid"}) == []
    assert call(sql, {"t": uuid.uuid4().hex}) == []
    admit_ticket(endpoint="lean.echo", input={}, parent_id=root.id)
    assert call(sql, {"t": root.trace_id}) == []  # the trace has its row now


def test_admit_existing_answers_the_holder_of_the_key(make_endpoint):
    endpoint = make_endpoint("lean.echo")
    held = admit_ticket(endpoint="lean.echo", input={"x": 1}, dedupe_key="kept").ticket
    sql = (
        "SELECT * FROM claimcheck_admit_existing(p_endpoint => %(e)s, p_address => %(a)s,"
        " p_owners => %(o)s, p_dedupe_key => %(k)s, p_submitted_by => NULL)"
    )
    params = {"e": endpoint.id, "a": "lean.echo", "o": endpoint.owners_id}
    [row] = call(sql, {**params, "k": "kept"})
    assert (row["o_status"], row["o_ticket"], row["o_owned"]) == ("existing", held.id, False)
    assert json.loads(row["o_row"])["input_sha256"] == held.input_sha256
    assert call(sql, {**params, "k": "other"}) == []


def test_admit_moved_answers_only_for_a_route_that_moved(make_endpoint):
    make_endpoint("lean.old", aliases=["lean.alias"])
    make_endpoint("lean.new")
    held = admit_ticket(endpoint="lean.alias", input={}, dedupe_key="m").ticket
    sql = (
        "SELECT * FROM claimcheck_admit_moved(p_address => 'lean.alias', p_dedupe_key => 'm',"
        " p_may_submit_restricted => true, p_submitted_by => NULL)"
    )
    assert call(sql, {}) == []  # the alias never moved: step 1 finds the key
    directory.move_alias(alias="lean.alias", to_address="lean.new", reason="v2", actor="t")
    [row] = call(sql, {})
    assert (row["o_status"], row["o_ticket"], row["o_address"]) == ("existing", held.id, "lean.old")


def test_admit_breaker_finds_the_party_and_refuses_past_the_limits(make_endpoint):
    make_endpoint("lean.echo")
    user = get_user_model().objects.create_user("bree")
    root = admit_ticket(endpoint="lean.echo", input={}, submitted_by_id=user.id).ticket
    child = admit_ticket(endpoint="lean.echo", input={}, parent_id=root.id).ticket
    sql = (
        "SELECT * FROM claimcheck_admit_breaker(p_trace => %(t)s, p_submitted_by => NULL,"
        " p_parent => %(p)s, p_rerun_of => NULL, p_now => now(), p_hard => %(h)s)"
    )
    [open_] = call(sql, {"t": root.trace_id, "p": child.id, "h": 3})
    assert (open_["o_refusal"], open_["o_party"]) == (None, str(user.id))
    [full] = call(sql, {"t": root.trace_id, "p": child.id, "h": 2})
    assert full["o_refusal"] == "circuit_open"
    Trace.objects.filter(id=root.trace_id).update(exhausted_at=timezone.now())
    [spent] = call(sql, {"t": root.trace_id, "p": child.id, "h": 3})
    assert spent["o_refusal"] == "trace_budget_exhausted"


def test_admit_count_flags_the_trace_once_past_the_soft_limit(make_endpoint):
    make_endpoint("lean.echo")
    root = admit_ticket(endpoint="lean.echo", input={}).ticket
    sql = (
        "SELECT claimcheck_admit_count(p_trace => %(t)s, p_party => '-', p_depth => 1,"
        " p_ticket => %(i)s, p_now => now(), p_soft => 2) AS flagged"
    )
    # The first call starts the row counting the root too (2 of the party
    # "-", not past 2); the second passes the soft limit; the third finds it flagged.
    flags = [call(sql, {"t": root.trace_id, "i": root.id})[0]["flagged"] for _ in range(3)]
    assert flags == [False, True, False]
    trace = Trace.objects.get(id=root.trace_id)
    assert (trace.tickets, trace.parties, trace.flagged) == (4, {"-": 4}, True)
    assert TicketEvent.objects.filter(ticket=root, kind="trace_soft_limit").count() == 1
