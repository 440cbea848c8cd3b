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
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from config.dispatch import RUN_TICKET, publish
from config.errors import (
    CircuitOpen,
    DedupeConflict,
    EndpointBusy,
    EndpointQuarantined,
    Invalid,
    NotFound,
    TooLarge,
)
from endpoints.models import BusyPolicy, Endpoint, EndpointState
from endpoints.selectors import open_case_id, resolve_endpoint

from .ids import new_id
from .lifecycle import append_event
from .models import CallbackState, ObligationState, Ticket, TicketState, Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admitted:
    ticket: Ticket
    duplicate: bool


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value: the basis of the input hash and caps."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def validate_dedupe_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or not key.isprintable():
        raise Invalid("dedupe_key must be 1 to 255 printable characters")
    return key


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
    actor: str = "",
) -> Admitted:
    """Admit one ticket (DESIGN.md flow 1).

    1. Check the caps and the dedupe key's shape.
    2. Fast path (PostgreSQL, a root ticket on a new trace): one statement
       inserts ticket, event and trace row, atomic on its own (no BEGIN or
       COMMIT round trips in autocommit); a new ticket costs one round trip.
    3. General path: resolve the endpoint (address or alias), look up
       ``(endpoint, dedupe_key)`` (same input -> duplicate, different -> 409),
       fail closed on quarantine, apply the busy policy and the circuit
       breaker, then insert; the unique constraint decides a race and the
       loser returns the winner's row.
    4. Publish the dispatch after commit.
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
    if trace_id is not None and (not trace_id or len(trace_id) > 64 or not trace_id.isprintable()):
        raise Invalid("trace_id must be 1 to 64 printable characters")
    requester = requester or {}
    if len(canonical_json(requester)) > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge("requester metadata is over the input cap")
    sha = hashlib.sha256(body).hexdigest()

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
        actor=actor,
    )


# The fast path. Inserts only when the endpoint exists, is available and (for
# a ``reject`` endpoint) idle; a root ticket starts a new trace, so the circuit
# breaker has nothing to refuse. Returns the new ticket's id, or the existing
# ticket holding the key (with its input hash), or no row.
_FAST_SQL = """
WITH ep AS (
    SELECT e.id, e.address FROM endpoints_endpoint e
    WHERE e.id = COALESCE(
        (SELECT id FROM endpoints_endpoint WHERE address = %(address)s),
        (SELECT endpoint_id FROM endpoints_endpointalias WHERE alias = %(address)s))
      AND e.state = 'available'
      AND (e.busy_policy = 'enqueue' OR NOT EXISTS (
            SELECT 1 FROM endpoints_endpointlock l
            WHERE l.endpoint_id = e.id AND l.holder_id IS NOT NULL))
),
lk AS (
    -- The lock row, locked for this statement: it orders this admission
    -- against a turn's start or release. Held: the release will dispatch
    -- this ticket (needs_dispatch), so no message now; free (or released
    -- while we waited: FOR UPDATE returns the new row): publish one.
    SELECT l.holder_id IS NOT NULL AS held FROM endpoints_endpointlock l, ep
    WHERE l.endpoint_id = ep.id FOR UPDATE OF l
),
ins AS (
    INSERT INTO tickets_ticket (
        id, endpoint_id, dedupe_key, input_sha256, input, trace_id, depth, state,
        artifacts, requester, submitted_by_id, callback_state, delivery_state,
        needs_dispatch, obligation_state, obligation_due_at, obligation_overdue,
        obligation_note, created_at, updated_at, version)
    SELECT %(id)s, ep.id, %(dedupe_key)s, %(sha)s, %(input)s::jsonb, %(trace_id)s, 0, 'queued',
        '[]'::jsonb, %(requester)s::jsonb, %(submitted_by_id)s, 'none', 'none',
        COALESCE((SELECT held FROM lk), false), 'open', %(due)s, false, '', %(now)s, %(now)s, 1
    FROM ep
    ON CONFLICT (endpoint_id, dedupe_key) DO NOTHING
    RETURNING id, endpoint_id, needs_dispatch
),
ev AS (
    INSERT INTO tickets_ticketevent (ticket_id, kind, from_state, to_state, actor, detail, at)
    SELECT id, 'admitted', '', 'queued', %(actor)s, '{}'::jsonb, %(now)s FROM ins
),
tr AS (
    INSERT INTO tickets_trace (id, tickets, max_depth, flagged, created_at)
    SELECT %(trace_id)s, 1, 0, false, %(now)s FROM ins
)
SELECT ins.id, ins.endpoint_id, ep.address, ins.needs_dispatch, NULL::varchar
FROM ins, ep
UNION ALL
-- Not inserted: the ticket that already holds the key (committed before this
-- statement began; a racing one is left to the general path).
SELECT t.id, t.endpoint_id, ep.address, false, t.input_sha256
FROM tickets_ticket t JOIN ep ON t.endpoint_id = ep.id
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
    # there is no BEGIN/COMMIT round trip, and the publish below runs at once.
    row = _execute_fast(params)
    if row is None:
        return None  # not a plain new ticket: the general path explains why
    found_id, endpoint_id, canonical_address, deferred, existing_sha = row
    if existing_sha is not None:  # a duplicate: one more round trip to load it
        if existing_sha != sha:
            raise DedupeConflict(
                f"dedupe key {dedupe_key!r} already names ticket {found_id} with a different input",
                ticket=str(found_id),
            )
        existing = Ticket.objects.select_related("endpoint", "turn").get(id=found_id)
        return Admitted(ticket=existing, duplicate=True)
    if not deferred:
        publish(RUN_TICKET, str(ticket_id))
    ticket = Ticket(
        id=ticket_id,
        endpoint_id=endpoint_id,
        dedupe_key=dedupe_key,
        input_sha256=sha,
        input=json.loads(input_json),
        trace_id=params["trace_id"],
        depth=0,
        state=TicketState.QUEUED,
        artifacts=[],
        requester=requester,
        submitted_by_id=submitted_by_id,
        needs_dispatch=deferred,
        obligation_state=ObligationState.OPEN,
        obligation_due_at=params["due"],
        created_at=now,
        updated_at=now,
    )
    ticket.endpoint = Endpoint(id=endpoint_id, address=canonical_address)
    return Admitted(ticket=ticket, duplicate=False)


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

    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
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
    actor: str,
) -> Admitted:
    endpoint = resolve_endpoint(address)
    if dedupe_key is not None:
        existing = _existing(endpoint, dedupe_key, sha)
        if existing is not None:
            return existing
    depth = 0
    if parent_id is not None:
        parent = Ticket.objects.filter(id=parent_id).only("trace_id", "depth").first()
        if parent is None:
            raise NotFound(f"parent ticket {parent_id} not found")
        if trace_id is not None and trace_id != parent.trace_id:
            raise Invalid("trace_id differs from the parent's trace")
        trace_id, depth = parent.trace_id, parent.depth + 1
    return_to_ep = resolve_endpoint(return_to) if return_to else None
    if endpoint.state == EndpointState.QUARANTINED:
        case = open_case_id(endpoint.id)
        raise EndpointQuarantined(
            f"endpoint {endpoint.address} is quarantined until an owner decides",
            case=str(case) if case else None,
        )
    # A re-run is an owner's decision, not new work competing for the endpoint.
    if rerun_of_id is None and endpoint.busy_policy == BusyPolicy.REJECT and _is_busy(endpoint):
        raise EndpointBusy(f"endpoint {endpoint.address} is running a turn and rejects new work")

    now = timezone.now()
    ticket_id = new_id()
    trace_id = trace_id or ticket_id.hex
    # A re-run carries its original's obligation to the requester.
    is_root = parent_id is None or rerun_of_id is not None
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
            publish(RUN_TICKET, str(ticket_id))
    except IntegrityError:
        # Lost the race on (endpoint, dedupe_key): the winner's row decides.
        if dedupe_key is None:
            raise
        existing = _existing(endpoint, dedupe_key, sha)
        if existing is None:
            raise
        return existing
    return Admitted(ticket=ticket, duplicate=False)


def _existing(endpoint: Endpoint, dedupe_key: str, sha: str) -> Admitted | None:
    # No ORDER BY (``.first()`` would add one): the lookup must go through the
    # unique (endpoint, dedupe_key) index, never an ordered scan of the
    # endpoint's tickets when statistics are stale.
    try:
        ticket = Ticket.objects.get(endpoint=endpoint, dedupe_key=dedupe_key)
    except Ticket.DoesNotExist:
        return None
    if ticket.input_sha256 != sha:
        raise DedupeConflict(
            f"dedupe key {dedupe_key!r} already names ticket {ticket.id} with a different input",
            ticket=str(ticket.id),
        )
    return Admitted(ticket=ticket, duplicate=True)


def _is_busy(endpoint: Endpoint) -> bool:
    from endpoints.models import EndpointLock

    held = EndpointLock.objects.filter(endpoint=endpoint, holder__isnull=False).exists()
    return held or Ticket.objects.filter(endpoint=endpoint, state=TicketState.QUEUED).exists()


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
