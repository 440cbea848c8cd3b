"""Small rules of the house: one source for caps, the state
strings the database holds, the broker's visibility timeout above the longest budget, the
database constraints that back the runtime, and the case keeper in place."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.errors import Invalid
from endpoints.models import BusyPolicy, EndpointState
from endpoints.services import MAX_BUDGET_S, update_endpoint
from runtime import turns as runtime
from runtime.ports import case_keeper
from tickets.admission import admit_ticket
from tickets.models import (
    CallbackState,
    Delivery,
    DeliveryState,
    EndpointLock,
    ObligationState,
    TicketState,
    Turn,
    TurnState,
)


def test_the_broker_never_redelivers_a_message_while_its_turn_may_run():
    assert settings.MAX_TURN_BUDGET_S == MAX_BUDGET_S
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    assert options["visibility_timeout"] > MAX_BUDGET_S


@pytest.mark.django_db
def test_a_budget_over_the_cap_is_refused(make_endpoint):
    make_endpoint("capped")
    with pytest.raises(Invalid, match="at most"):
        update_endpoint(address="capped", changes={"turn_budget_s": MAX_BUDGET_S + 1}, actor="t")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("tickets_ticket", "state", TicketState),
        ("tickets_ticket", "callback_state", CallbackState),
        ("tickets_ticket", "delivery_state", DeliveryState),
        ("tickets_ticket", "obligation_state", ObligationState),
        ("tickets_delivery", "mode", Delivery.Mode),
        ("runtime_turn", "state", TurnState),
        ("endpoints_endpoint", "state", EndpointState),
        ("endpoints_endpoint", "busy_policy", BusyPolicy),
    ],
)
def test_the_python_enums_are_what_the_database_holds(table, column, enum):
    """The database functions (claimcheck_admit, claimcheck_start_turn,
    claimcheck_finish_turn, ...) write these columns' values as literals; a
    CHECK constraint holds each column to its enum, so a literal outside it
    fails the statement. Here the constraint the database holds is the
    enum, value for value."""
    import re

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
            " JOIN pg_class t ON t.oid = c.conrelid"
            " WHERE t.relname = %s AND c.contype = 'c'",
            [table],
        )
        definitions = [row[0] for row in cur.fetchall()]
    [definition] = [d for d in definitions if re.search(rf"\(\(?{column}\)?::text = ANY", d)]
    held = set(re.findall(r"'([^']*)'::character varying", definition))
    assert held == set(enum.values), (table, column, definition)


def test_the_case_keeper_is_provided_by_recovery():
    assert case_keeper().open_case_for_uncertain_turn.__module__ == "recovery.services"


def test_every_endpoint_has_its_lock_row_from_its_creation(make_endpoint):
    """The directory creates endpoints without knowing the runtime's lock: a
    trigger of the runtime's migration inserts the row."""
    endpoint = make_endpoint("rules.lock")
    lock = EndpointLock.objects.get(endpoint_id=endpoint.id)
    assert lock.holder_id is None and lock.token is None


def test_only_a_quarantined_endpoint_names_an_open_case(make_endpoint):
    import uuid

    from endpoints.models import Endpoint

    endpoint = make_endpoint("rules.case")
    with (
        pytest.raises(IntegrityError, match="endpoint_case_when_quarantined"),
        transaction.atomic(),
    ):
        Endpoint.objects.filter(id=endpoint.id).update(quarantine_case=uuid.uuid4())


@pytest.fixture
def started(db, make_endpoint):
    make_endpoint("rules")
    ticket = admit_ticket(endpoint="rules", input={}).ticket
    return runtime.start_turn(ticket_id=ticket.id)


def test_two_turns_of_one_endpoint_never_share_a_seq(started):
    turn = started.turn
    with pytest.raises(IntegrityError, match="turn_seq_unique"), transaction.atomic():
        Turn.objects.create(
            endpoint=turn.endpoint,
            ticket=turn.ticket,
            seq=turn.seq,
            runner_kind=turn.runner_kind,
            started_at=turn.started_at,
            heartbeat_at=turn.heartbeat_at,
            deadline_at=turn.deadline_at,
        )


def test_a_lock_holder_and_its_token_are_set_and_cleared_together(started):
    endpoint_id = started.endpoint.id
    with pytest.raises(IntegrityError, match="lock_holder_token_together"), transaction.atomic():
        EndpointLock.objects.filter(endpoint_id=endpoint_id).update(token=None)
    with pytest.raises(IntegrityError, match="lock_holder_token_together"), transaction.atomic():
        EndpointLock.objects.filter(endpoint_id=endpoint_id).update(holder=None)


def test_an_endpoint_has_one_open_case_at_most(started):
    keeper = case_keeper()
    now = timezone.now()
    keeper.open_case_for_uncertain_turn(turn=started.turn, reason="first", at=now)
    with pytest.raises(IntegrityError, match="one_open_case_per_endpoint"), transaction.atomic():
        keeper.open_case_for_uncertain_turn(turn=started.turn, reason="second", at=now)


def test_text_caps_come_from_one_source():
    """A text's cap is the same in the API's schema, the service behind it,
    the console's form and the column (core/limits.py)."""
    from console.forms import DecisionForm, LessonForm
    from core import limits
    from endpoints.models import Endpoint
    from recovery import services as recovery
    from runtime.api import EndpointIn
    from tickets import obligations
    from tickets.api import ObligationCloseIn, TicketIn
    from tickets.models import Ticket

    def schema_cap(model, field):
        return next(
            m.max_length for m in model.model_fields[field].metadata if hasattr(m, "max_length")
        )

    assert schema_cap(TicketIn, "endpoint") == schema_cap(EndpointIn, "address")
    assert schema_cap(EndpointIn, "address") == Endpoint._meta.get_field("address").max_length
    assert schema_cap(ObligationCloseIn, "note") == obligations.MAX_NOTE_CHARS == limits.NOTE_CHARS
    assert Ticket._meta.get_field("dedupe_key").max_length == recovery.MAX_DEDUPE_KEY
    form_caps = {
        f.max_length
        for form in (DecisionForm, LessonForm)
        for f in form.base_fields.values()
        if getattr(f, "max_length", None)
    }
    assert form_caps == {recovery.MAX_TEXT} == {limits.TEXT_CHARS}


@pytest.mark.django_db
def test_no_index_is_a_prefix_of_another_on_the_same_table():
    """Every index costs a write per row (issue 12): a plain index whose
    columns begin another index of the same table serves nothing that one
    does not. Unique and partial indexes are left out (they constrain or
    cover other rows). Django's own many-to-many tables are left out too: it
    makes both of their indexes."""
    from django.apps import apps
    from django.db import connection

    ours = [
        m._meta.db_table
        for m in apps.get_models(include_auto_created=False)
        if m._meta.app_label
        in ("tickets", "endpoints", "runtime", "recovery", "console", "accounts", "health")
    ]

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname, i.relname, x.indkey::text || '/' || x.indclass::text,
                x.indisunique, x.indpred IS NOT NULL
            FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid
            JOIN pg_class c ON c.oid = x.indrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = current_schema() AND x.indexprs IS NULL
              AND c.relname = ANY(%s)
            """,
            [ours],
        )
        rows = cur.fetchall()
    redundant = []
    for table, name, keys, unique, partial in rows:
        if unique or partial:
            continue
        cols = _index_columns(keys)
        for other_table, other, other_keys, _, other_partial in rows:
            other_cols = _index_columns(other_keys)
            if (
                other_table == table
                and other != name
                and not other_partial
                and len(other_cols) > len(cols)
                and other_cols[: len(cols)] == cols
            ):
                redundant.append(f"{table}.{name} (led by {other})")
    assert not redundant, redundant


@pytest.mark.django_db
def test_an_index_of_a_nullable_ledger_column_holds_only_the_rows_that_set_it():
    """Bytes per ticket and index entries per ticket version: an index led
    by a nullable column of the ticket or event table, unique or not, holds an entry for every row
    version, NULL or not. A ticket is written three times or more, none of
    them a HOT update; a reference most tickets leave empty (parent, re-run,
    approver, callback), or leave empty for a while (a queued ticket's turn)
    or for good (the runtime's own admissions have no submitter), is an
    entry per version for nothing. Every such index is partial (``WHERE …
    IS NOT NULL``), which still serves every lookup and foreign-key check by
    value."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname, i.relname, a.attname, x.indpred IS NOT NULL
            FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid
            JOIN pg_class c ON c.oid = x.indrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = x.indkey[0]
            WHERE n.nspname = current_schema()
              AND c.relname IN ('tickets_ticket', 'tickets_ticketevent')
              AND NOT a.attnotnull
            """
        )
        found = cur.fetchall()
    columns = {column for _, _, column, _ in found}
    assert {"turn_id", "callback_for_id", "submitted_by_id", "parent_id"} <= columns, columns
    assert [f"{t}.{i} ({c})" for t, i, c, partial in found if not partial] == []


@pytest.mark.django_db
def test_an_event_names_its_turn_without_a_foreign_key_or_an_index():
    """The event's turn is informational (the statement that writes it holds
    the turn): a foreign key cost a check on every turn event, and its index
    an entry per event, mostly NULL. The event's
    ticket keeps both."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT a.attname, count(DISTINCT k.oid), count(DISTINCT x.indexrelid)
            FROM pg_attribute a
            LEFT JOIN pg_constraint k ON k.conrelid = a.attrelid AND k.contype = 'f'
                AND k.conkey = ARRAY[a.attnum]
            LEFT JOIN pg_index x ON x.indrelid = a.attrelid AND x.indkey[0] = a.attnum
            WHERE a.attrelid = 'tickets_ticketevent'::regclass
              AND a.attname IN ('turn_id', 'ticket_id')
            GROUP BY a.attname
            """
        )
        found = {name: (fks, indexes) for name, fks, indexes in cur.fetchall()}
    assert found == {"ticket_id": (1, 1), "turn_id": (0, 0)}


def _index_columns(keys: str) -> list[tuple[str, str]]:
    """(column number, operator class) of each column of an index."""
    columns, classes = keys.split("/")
    return list(zip(columns.split(), classes.split(), strict=True))
