"""Admission: a request becomes a ticket, or finds the ticket it already is.

The hot path is one statement on PostgreSQL: resolve the endpoint, insert the
ticket with ``ON CONFLICT DO NOTHING``, write its event and count it on its
trace, all in one CTE. Anything unusual (a duplicate, a conflict, an unknown or
quarantined endpoint, a busy ``reject`` endpoint, a child ticket) falls back to
the general path, which explains itself with the documented error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from config import observe
from config.canonical import canonical_json
from config.dispatch import wake_dispatcher
from config.errors import (
    CircuitOpen,
    DedupeConflict,
    EndpointBusy,
    EndpointQuarantined,
    Forbidden,
    Invalid,
    NotFound,
    TooLarge,
)
from config.limits import DEDUPE_KEY_CHARS, TRACE_ID_CHARS

from .ids import new_id
from .lifecycle import append_event
from .models import (
    CallbackState,
    DeliveryState,
    ObligationState,
    Ticket,
    TicketState,
    Trace,
)
from .ports import ENDPOINT_AVAILABLE, ENDPOINT_ENQUEUE, endpoint_directory
from .selectors import may_see, visible_tickets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admitted:
    ticket: Ticket
    duplicate: bool


def validate_dedupe_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= DEDUPE_KEY_CHARS or not key.isprintable():
        raise Invalid(f"dedupe_key must be 1 to {DEDUPE_KEY_CHARS} printable characters")
    return key


@observe.admission  # admitted/duplicate/refused counters; the trace a response returns
def admit_ticket(
    *,
    endpoint: str,
    input: dict[str, Any],  # noqa: A002 - the contract's name
    dedupe_key: str | None = None,
    parent_id: uuid.UUID | None = None,
    trace_id: str | None = None,
    return_to: str | None = None,
    continuation: dict[str, Any] | None = None,
    requester: dict[str, Any] | None = None,
    callback_for_id: uuid.UUID | None = None,
    rerun_of_id: uuid.UUID | None = None,
    submitted_by_id: int | None = None,
    submitter: AbstractBaseUser | None = None,
    actor: str = "",
) -> Admitted:
    """Admit one ticket (DESIGN.md flow 1).

    ``submitter`` is the user asking (an API key's user): the ticket is
    theirs to see, a restricted endpoint (or ``return_to``) must let them
    submit (403 otherwise, before any lookup by dedupe key, so a refused
    caller learns nothing about existing tickets), a ``parent`` must be a
    ticket they may see, and a duplicate they may not see is a
    ``dedupe_conflict`` that names no ticket. Admissions by the runtime
    itself (children, callbacks, re-runs) have no submitter.

    1. Check the caps and the dedupe key's shape.
    2. Fast path (PostgreSQL, a root ticket on a new trace): one statement
       inserts ticket, event and trace row, atomic on its own (no BEGIN or
       COMMIT round trips in autocommit); a new ticket costs one round trip.
    3. General path: resolve the endpoint (address or alias), look up
       ``(endpoint, dedupe_key)`` (same input -> duplicate, different -> 409),
       fail closed on quarantine, apply the busy policy and the circuit
       breaker, then insert; the unique constraint decides a race and the
       loser returns the winner's row.
    4. No broker publish: the ticket is marked ``needs_dispatch`` and the
       dispatcher (endpoints/dispatcher.py) is woken by a NOTIFY at commit.
    """
    if not isinstance(input, dict):
        raise Invalid("input must be a JSON object")
    body = canonical_json(input)
    if len(body) > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge(
            f"input is {len(body)} bytes; the cap is {settings.TICKET_MAX_INPUT_BYTES}",
            limit=settings.TICKET_MAX_INPUT_BYTES,
        )
    dedupe_key = validate_dedupe_key(dedupe_key)
    if trace_id is not None and (
        not trace_id or len(trace_id) > TRACE_ID_CHARS or not trace_id.isprintable()
    ):
        raise Invalid(f"trace_id must be 1 to {TRACE_ID_CHARS} printable characters")
    requester = requester or {}
    if len(canonical_json(requester)) > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge("requester metadata is over the input cap")
    sha = hashlib.sha256(body).hexdigest()
    if submitter is not None:
        submitted_by_id = submitter.id

    if (
        connection.vendor == "postgresql"
        and parent_id is None
        and trace_id is None
        and return_to is None
        and callback_for_id is None
        and rerun_of_id is None
    ):
        fast = _admit_fast_pg(
            address=endpoint,
            input_json=body.decode(),
            sha=sha,
            dedupe_key=dedupe_key,
            requester=requester,
            submitted_by_id=submitted_by_id,
            submitter=submitter,
            actor=actor,
        )
        if fast is not None:
            return fast
    return _admit_general(
        address=endpoint,
        input=input,
        sha=sha,
        dedupe_key=dedupe_key,
        parent_id=parent_id,
        trace_id=trace_id,
        return_to=return_to,
        continuation=continuation,
        requester=requester,
        callback_for_id=callback_for_id,
        rerun_of_id=rerun_of_id,
        submitted_by_id=submitted_by_id,
        submitter=submitter,
        actor=actor,
    )


# The fast path. Inserts only when the endpoint exists, is available, lets
# anyone submit (a restricted one takes the general path, which checks who
# asks before it looks anything up) and (for a ``reject`` endpoint) is idle;
# a root ticket starts a new trace, so the circuit breaker has nothing to
# refuse. Returns the new ticket's id, or the existing ticket holding the key
# (with its input hash), or no row.
# State strings come from the enums (endpoint ones through tickets.ports, which a
# test holds equal to endpoints' enums).
_QUEUED, _OB_OPEN = TicketState.QUEUED.value, ObligationState.OPEN.value
_CB_NONE, _DL_NONE = CallbackState.NONE.value, DeliveryState.NONE.value
# Every field of the ticket, for the duplicate branch, which returns the row
# as one JSON value (to_jsonb): a result of forty-odd columns cost every
# admission, new ones included (NULLs there), about 50 us to describe and
# load (bench/admission_parts.py). _ticket_from_row reads it back.
_TICKET_FIELDS = tuple(Ticket._meta.concrete_fields)
_TICKET_ATTNAMES = [f.attname for f in _TICKET_FIELDS]
_FAST_SQL = f"""
WITH ep AS (
    SELECT e.id, e.address, e.owners_id FROM endpoints_endpoint e
    WHERE e.id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = %(address)s),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = %(address)s))
      AND e.state = '{ENDPOINT_AVAILABLE}'
      AND NOT e.submit_restricted
      AND (e.busy_policy = '{ENDPOINT_ENQUEUE}' OR NOT EXISTS (
            SELECT 1 FROM endpoints_endpointlock l
            WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL))
),
ins AS (
    INSERT INTO tickets_ticket (
        id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state,
        artifacts, requester, submitted_by_id, callback_state, delivery_state,
        needs_dispatch, obligation_state, obligation_due_at, obligation_overdue,
        obligation_note, created_at, updated_at, version)
    SELECT %(id)s, ep.id, %(dedupe_key)s, %(sha)s, %(input)s::jsonb, %(trace_id)s, 0, '{_QUEUED}',
        '[]'::jsonb, %(requester)s::jsonb, %(submitted_by_id)s, '{_CB_NONE}', '{_DL_NONE}',
        true, '{_OB_OPEN}', %(due)s, false, '', %(now)s, %(now)s, 1
    FROM ep
    ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
    -- The ledger is the outbox: the ticket owes a dispatch (needs_dispatch)
    -- and the dispatcher is woken when this statement commits. No broker
    -- round trip on the request path.
    RETURNING id, endpoint_id, pg_notify('claimcheck_dispatch', '') IS NULL AS woke
),
ev AS (
    INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
    SELECT id, 'admitted', '', '{_QUEUED}', %(actor)s, '{{}}'::jsonb, %(now)s FROM ins
),
tr AS (
    INSERT INTO tickets_trace (id, tickets, max_depth, flagged, created_at)
    SELECT %(trace_id)s, 1, 0, false, %(now)s FROM ins
)
SELECT ins.id, ins.endpoint_id, ep.address, true, NULL, NULL, NULL, NULL, NULL::jsonb
FROM ins, ep
UNION ALL
-- Not inserted: the ticket that already holds the key (committed before this
-- statement began; a racing one is left to the general path), whole, with
-- what its payload and the visibility check need: whether the submitter owns
-- the endpoint (a member of its owners group, as owned_endpoint_ids), its
-- turn's seq and state, its return_to's address. A duplicate is one round trip.
SELECT t.id, t.endpoint_id, ep.address, false,
    EXISTS (SELECT 1 FROM auth_user_groups ug
            WHERE ug.group_id = ep.owners_id AND ug.user_id = %(submitted_by_id)s),
    tu.seq, tu.state, rt.address, to_jsonb(t)
FROM tickets_ticket t JOIN ep ON t.endpoint_id = ep.id
LEFT JOIN endpoints_turn tu ON tu.id = t.turn_id
LEFT JOIN endpoints_endpoint rt ON rt.id = t.return_to_id
WHERE t.dedupe_key = %(dedupe_key)s AND NOT EXISTS (SELECT 1 FROM ins)
"""


def _admit_fast_pg(
    *,
    address: str,
    input_json: str,
    sha: str,
    dedupe_key: str | None,
    requester: dict[str, Any],
    submitted_by_id: int | None,
    submitter: AbstractBaseUser | None,
    actor: str,
) -> Admitted | None:
    now = timezone.now()
    ticket_id = new_id()
    params = {
        "address": address,
        "id": ticket_id,
        "dedupe_key": dedupe_key,
        "sha": sha,
        "input": input_json,
        "trace_id": ticket_id.hex,
        "requester": json.dumps(requester),
        "submitted_by_id": submitted_by_id,
        "due": now + timedelta(seconds=settings.OBLIGATION_UPDATE_INTERVAL_S),
        "now": now,
        "actor": actor,
    }
    # One statement is atomic by itself: no atomic() block, so in autocommit
    # there is no BEGIN/COMMIT round trip, and the NOTIFY goes out at once.
    row = _execute_fast(params)
    if row is None:
        return None  # not a plain new ticket: the general path explains why
    found_id, endpoint_id, canonical_address, inserted, owned = row[:5]
    if not inserted:
        # The ticket holding the key came back whole with the statement: a
        # duplicate or a conflict costs no further round trip.
        existing = _ticket_from_row(row, canonical_address)
        visible = submitter is None or (
            submitter.is_authenticated
            and (
                submitter.is_staff
                or (
                    existing.submitted_by_id is not None
                    and existing.submitted_by_id == submitter.id
                )
                or bool(owned)
            )
        )
        return _duplicate(
            existing, dedupe_key=dedupe_key, sha=sha, submitter=submitter, visible=visible
        )
    # The row as the statement inserted it, loaded as the ORM loads a row
    # (from_db: positional, no keyword handling; 0.15 ms of a 0.9 ms
    # admission went to Ticket(**fields)). The fields it leaves out are NULL.
    inserted_row = {
        "id": ticket_id,
        "endpoint_id": endpoint_id,
        "dedupe_key": dedupe_key,
        "input_sha256": sha,
        "input": json.loads(input_json),
        "trace_id": params["trace_id"],
        "depth": 0,
        "state": TicketState.QUEUED.value,
        "artifacts": [],
        "requester": requester,
        "submitted_by_id": submitted_by_id,
        "callback_state": CallbackState.NONE.value,
        "delivery_state": DeliveryState.NONE.value,
        "needs_dispatch": True,
        "obligation_state": ObligationState.OPEN.value,
        "obligation_due_at": params["due"],
        "obligation_overdue": False,
        "obligation_note": "",
        "created_at": now,
        "updated_at": now,
        "version": 1,
    }
    alias = connection.alias
    ticket = Ticket.from_db(
        alias, _TICKET_ATTNAMES, [inserted_row.get(a) for a in _TICKET_ATTNAMES]
    )
    # The endpoint as the statement read it (the ticket's own foreign key
    # names the model: tickets never imports endpoints).
    ticket.endpoint = Ticket.endpoint.field.related_model.from_db(
        alias, ["id", "address"], [endpoint_id, canonical_address]
    )
    return Admitted(ticket=ticket, duplicate=False)


# What JSON carries as the ORM loads it: integers, booleans, text, and JSON
# columns (decoded with the row).
_AS_IS = {
    "AutoField",
    "BigAutoField",
    "BigIntegerField",
    "BooleanField",
    "CharField",
    "IntegerField",
    "JSONField",
    "PositiveIntegerField",
    "SmallIntegerField",
    "TextField",
}


def _from_json(field) -> Any:
    """How a field's value in ``to_jsonb`` of the row becomes what the ORM
    loads: ids and instants are strings in JSON, to convert; the rest as
    they are. A field of another kind (a date, a decimal) fails here, at
    import, rather than reach a duplicate as the wrong type."""
    kind = getattr(field, "target_field", field).get_internal_type()
    if kind == "UUIDField":
        return uuid.UUID
    if kind == "DateTimeField":
        return lambda text: datetime.fromisoformat(text).astimezone(UTC)
    if kind not in _AS_IS:
        raise TypeError(f"Ticket.{field.name} ({kind}): no conversion from to_jsonb")
    return None


_TICKET_FROM_JSON = [(f.column, _from_json(f)) for f in _TICKET_FIELDS]


def _ticket_from_row(row: tuple, endpoint_address: str) -> Ticket:
    """The existing ticket from the statement's duplicate branch (its row as
    one JSON value), as the ORM would load it, with its endpoint, turn and
    return_to as far as the payload reads them (any other field of those
    loads on access)."""
    turn_seq, turn_state, return_to_address, data = row[5:9]
    if isinstance(data, str | bytes):  # Django's jsonb loader leaves it text
        data = json.loads(data)
    values = [
        value if convert is None or value is None else convert(value)
        for column, convert in _TICKET_FROM_JSON
        for value in (data[column],)
    ]
    alias = connection.alias
    ticket = Ticket.from_db(alias, _TICKET_ATTNAMES, values)
    endpoint_model = Ticket.endpoint.field.related_model
    ticket.endpoint = endpoint_model.from_db(
        alias, ["id", "address"], [ticket.endpoint_id, endpoint_address]
    )
    if ticket.turn_id is not None:
        ticket.turn = Ticket.turn.field.related_model.from_db(
            alias, ["id", "seq", "state"], [ticket.turn_id, turn_seq, turn_state]
        )
    if ticket.return_to_id is not None:
        ticket.return_to = endpoint_model.from_db(
            alias, ["id", "address"], [ticket.return_to_id, return_to_address]
        )
    return ticket


def _execute_fast(params: dict[str, Any]) -> tuple | None:
    """Run the fast-path statement. With ``ADMISSION_PREPARED`` (default) it
    goes through a server-side-binding psycopg cursor as a prepared
    statement, so PostgreSQL plans it once per connection instead of on
    every admission (Django's own cursors bind client-side and never
    prepare). Off for poolers that cannot keep prepared statements
    (PgBouncer in transaction mode before 1.21)."""
    if not settings.ADMISSION_PREPARED:
        with connection.cursor() as cur:
            cur.execute(_FAST_SQL, params)
            return cur.fetchone()
    import psycopg

    # What Django's own cursor() does around a query: the health check of a
    # reused connection (CONN_HEALTH_CHECKS), so one left broken by a database
    # restart is replaced instead of failing this request; and errors wrapped
    # as Django's, which marks the connection for the end-of-request check.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cur:
        cur.execute(_FAST_SQL, params, prepare=True)
        return cur.fetchone()


def _admit_general(
    *,
    address: str,
    input: dict[str, Any],  # noqa: A002
    sha: str,
    dedupe_key: str | None,
    parent_id: uuid.UUID | None,
    trace_id: str | None,
    return_to: str | None,
    continuation: dict[str, Any] | None,
    requester: dict[str, Any],
    callback_for_id: uuid.UUID | None,
    rerun_of_id: uuid.UUID | None,
    submitted_by_id: int | None,
    submitter: AbstractBaseUser | None,
    actor: str,
) -> Admitted:
    directory = endpoint_directory()
    endpoint = directory.resolve(address)
    return_to_ep = directory.resolve(return_to) if return_to else None
    if submitter is not None:
        # Before the dedupe lookup: a refused caller learns nothing about
        # the tickets already there. A return_to sends the callback ticket
        # (and the continuation the caller chose) to that endpoint: the same
        # rule applies to it.
        for target in (endpoint, return_to_ep):
            if target is not None and not directory.may_submit(submitter, target):
                raise Forbidden(f"you may not submit tickets to {target.address}")
    if dedupe_key is not None:
        existing = _existing(endpoint, dedupe_key, sha, submitter)
        if existing is not None:
            return existing
    depth = 0
    if parent_id is not None:
        parents = Ticket.objects if submitter is None else visible_tickets(submitter)
        parent = parents.filter(id=parent_id).only("trace_id", "depth").first()
        if parent is None:
            raise NotFound(f"parent ticket {parent_id} not found")
        if trace_id is not None and trace_id != parent.trace_id:
            raise Invalid("trace_id differs from the parent's trace")
        trace_id, depth = parent.trace_id, parent.depth + 1
    if directory.is_quarantined(endpoint):
        case = directory.open_case_id(endpoint.id)
        raise EndpointQuarantined(
            f"endpoint {endpoint.address} is quarantined until an owner decides",
            case=str(case) if case else None,
        )
    # A re-run is an owner's decision, not new work competing for the endpoint.
    if rerun_of_id is None and directory.rejects_when_busy(endpoint) and _is_busy(endpoint):
        raise EndpointBusy(f"endpoint {endpoint.address} is running a turn and rejects new work")

    now = timezone.now()
    ticket_id = new_id()
    trace_id = trace_id or ticket_id.hex
    # A re-run carries its original's obligation to the requester; a child's
    # re-run has none (it answers the waiting parent through the callback).
    is_root = parent_id is None or (
        rerun_of_id is not None
        and Ticket.objects.filter(id=rerun_of_id)
        .exclude(obligation_state=ObligationState.NONE)
        .exists()
    )
    try:
        with transaction.atomic():
            ticket = Ticket.objects.create(
                id=ticket_id,
                endpoint=endpoint,
                dedupe_key=dedupe_key,
                input_sha256=sha,
                input=input,
                parent_id=parent_id,
                trace_id=trace_id,
                depth=depth,
                state=TicketState.QUEUED,
                return_to=return_to_ep,
                continuation=continuation,
                callback_for_id=callback_for_id,
                rerun_of_id=rerun_of_id,
                callback_state=CallbackState.PENDING if return_to_ep else CallbackState.NONE,
                requester=requester,
                submitted_by_id=submitted_by_id,
                needs_dispatch=True,
                obligation_state=ObligationState.OPEN if is_root else ObligationState.NONE,
                obligation_due_at=(
                    now + timedelta(seconds=settings.OBLIGATION_UPDATE_INTERVAL_S)
                    if is_root
                    else None
                ),
                created_at=now,
                updated_at=now,
            )
            append_event(
                ticket_id=ticket_id,
                kind="admitted",
                actor=actor,
                to_state=TicketState.QUEUED,
                detail={"parent": str(parent_id)} if parent_id else None,
            )
            count = _count_on_trace(trace_id=trace_id, depth=depth, now=now)
            if count > settings.TRACE_SOFT_LIMIT:
                _check_trace(trace_id=trace_id, count=count, ticket_id=ticket_id)
            if count > settings.TRACE_HARD_LIMIT:
                _raise_circuit_open(trace_id)
            # The ledger is the outbox: marked above, the dispatcher woken
            # at commit (or its next poll on SQLite).
            wake_dispatcher()
    except IntegrityError:
        # Lost the race on (endpoint, dedupe_key): the winner's row decides.
        if dedupe_key is None:
            raise
        existing = _existing(endpoint, dedupe_key, sha, submitter)
        if existing is None:
            raise
        return existing
    return Admitted(ticket=ticket, duplicate=False)


def _existing(
    endpoint: Any, dedupe_key: str, sha: str, submitter: AbstractBaseUser | None
) -> Admitted | None:
    # No ORDER BY (``.first()`` would add one): the lookup must go through the
    # unique (endpoint, dedupe_key) index, never an ordered scan of the
    # endpoint's tickets when statistics are stale.
    try:
        ticket = Ticket.objects.select_related("endpoint").get(
            endpoint=endpoint, dedupe_key=dedupe_key
        )
    except Ticket.DoesNotExist:
        return None
    return _duplicate(ticket, dedupe_key=dedupe_key, sha=sha, submitter=submitter)


def _duplicate(
    ticket: Ticket,
    *,
    dedupe_key: str,
    sha: str,
    submitter: AbstractBaseUser | None,
    visible: bool | None = None,
) -> Admitted:
    """The ticket already holding the key: returned as the duplicate when
    the inputs match, else 409. To a submitter who may not see it, it does
    not exist: the key is taken, and that is all the conflict says (the
    key's namespace is the endpoint's, shared by everyone who submits).
    ``visible``: ``may_see`` already decided by the caller (the fast path's
    statement answers it), else asked here."""
    if visible is None:
        visible = submitter is None or may_see(submitter, ticket)
    if not visible:
        raise DedupeConflict(
            f"dedupe key {dedupe_key!r} is already taken on {ticket.endpoint.address}"
        )
    if ticket.input_sha256 != sha:
        raise DedupeConflict(
            f"dedupe key {dedupe_key!r} already names ticket {ticket.id} with a different input",
            ticket=str(ticket.id),
        )
    return Admitted(ticket=ticket, duplicate=True)


def _is_busy(endpoint: Any) -> bool:
    return (
        endpoint_directory().is_locked(endpoint)
        or Ticket.objects.filter(endpoint=endpoint, state=TicketState.QUEUED).exists()
    )


def _count_on_trace(*, trace_id: str, depth: int, now) -> int:
    """Count one more ticket on the trace; the row lock serialises admissions
    to one trace, so the limit cannot be overshot by a race."""
    trace, created = Trace.objects.select_for_update().get_or_create(
        id=trace_id, defaults={"tickets": 1, "max_depth": depth, "created_at": now}
    )
    if created:
        return 1
    Trace.objects.filter(id=trace_id).update(
        tickets=trace.tickets + 1, max_depth=max(trace.max_depth, depth)
    )
    return trace.tickets + 1


def _check_trace(*, trace_id: str, count: int, ticket_id: uuid.UUID) -> None:
    """Past the soft limit: flag the trace once and warn on the ticket."""
    if not Trace.objects.filter(id=trace_id, flagged=False).update(flagged=True):
        return  # already flagged and warned
    log.warning("trace %s passed its soft limit (%s tickets)", trace_id, count)
    append_event(
        ticket_id=ticket_id,
        kind="trace_soft_limit",
        actor="circuit-breaker",
        detail={"trace_id": trace_id, "tickets": count, "soft_limit": settings.TRACE_SOFT_LIMIT},
    )


def _raise_circuit_open(trace_id: str) -> None:
    raise CircuitOpen(
        f"trace {trace_id} holds {settings.TRACE_HARD_LIMIT} tickets, its hard limit",
        trace_id=trace_id,
        limit=settings.TRACE_HARD_LIMIT,
    )
