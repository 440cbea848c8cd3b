"""Start and finish of a turn in one statement each, on PostgreSQL.

The general paths (``start.start_turn``, ``finish.finish_turn``) take the
rows one query at a time inside a transaction: 9 statements to start a turn,
about 14 to finish one, and two COMMITs. Here each is one statement (CTEs
over the lock row, the ticket, the turn, the endpoint and the event), which
in autocommit is its own transaction: no BEGIN, no COMMIT round trip.

Every guard of the general path is in the statement, and a statement whose
guard does not hold writes nothing:

- start: the message's ticket still ``queued``; the endpoint's lock row
  taken ``FOR UPDATE`` first and free; the endpoint's oldest queued ticket
  (``SKIP LOCKED``) next; ``turn_seq`` bumped only while the endpoint is
  ``available`` (quarantine fails closed); the lock held only if still free;
  the ticket moved only from ``queued``. The message's ticket is marked
  ``needs_dispatch`` exactly when the general path marks it.
- finish (the common case only: a root ticket with no callback, a
  ``success`` or ``failure`` outcome, a turn still ``running``): the ticket
  ``running`` with this turn registered, the lock held by this turn with
  token ``seq``, the turn's own ``seq`` equal and its state ``running``;
  then the turn ends, the context entry, the ticket's terminal transition
  and event, the delivery record and its event, the release of the lock,
  the next marked ticket unmarked (or the dispatcher woken) and the
  ticket's watchers notified (and, in a worker, its registry slot: busy at
  the start, idle at the finish). Anything else (a stale or foreign outcome, a duplicate
  finish, an interrupted turn, children, callbacks, resumes) finds no row
  and goes to the general path, which sorts it out as before.

One statement reads every table with one snapshot, taken before it waits
for a row lock; a row it locks or updates is re-read at its latest version
(READ COMMITTED), and its WHERE re-tested there, only if the snapshot's
version passed it. So the guards are written to hold on both versions (see
``hold`` and ``nt``).

Row locks are taken in the general paths' order: start ``EndpointLock``
then the queued ticket then ``Endpoint``; finish ``Ticket`` then
``EndpointLock`` then ``Turn``. Each later CTE reads the earlier one through
an uncorrelated sub-select, which PostgreSQL evaluates before it scans.

Both statements are PostgreSQL only; SQLite (``make run``) keeps the general
paths. ``TURN_FAST_PATH = False`` switches them off (the general paths then
serve PostgreSQL too)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Model

from tickets.models import (
    CallbackState,
    DeliveryState,
    Ticket,
    TicketState,
)

from ..models import Endpoint, EndpointState, Turn, TurnState


def enabled() -> bool:
    return connection.vendor == "postgresql" and settings.TURN_FAST_PATH


def _columns(model: type[Model], alias: str) -> tuple[list[str], str]:
    fields = list(model._meta.concrete_fields)
    return [f.attname for f in fields], ", ".join(f'{alias}."{f.column}"' for f in fields)


_EP_NAMES, _EP_COLS = _columns(Endpoint, "e")
_TURN_NAMES, _TURN_COLS = _columns(Turn, "u")
_TICKET_NAMES, _TICKET_COLS = _columns(Ticket, "t")


def _rows_to(model: type[Model], names: list[str], values: tuple) -> Model:
    """A model instance from the columns a statement returned, converted the
    way the ORM converts them (json text to Python)."""
    converted = []
    for name, value in zip(names, values, strict=True):
        field = model._meta.get_field(name) if not name.endswith("_id") else None
        if field is not None and hasattr(field, "from_db_value") and isinstance(value, str):
            value = field.from_db_value(value, None, connection)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


def _execute(sql: str, params: dict[str, Any]) -> tuple | None:
    """One statement through Django's cursor: its health check, its execute
    wrappers (the fault-injection tests, the bench's statement clock) and its
    error wrapping all apply. With ``TURN_PREPARED`` (default) the statement
    runs as a server-side prepared statement on that connection: planning
    these CTEs costs the server about as much as running them (EXPLAIN: 1.1 to
    1.8 ms of planning against 1.7 ms of execution for the start), and
    PostgreSQL then plans each once per connection."""
    with connection.cursor() as cur:
        if settings.TURN_PREPARED:
            cur.cursor.close()
            cur.cursor = _PreparedCursor(connection.connection)
        cur.execute(sql, params)
        return cur.fetchone()


class _QueryText:
    """What Django's query log reads of a psycopg cursor (``_query.query``)."""

    __slots__ = ("query",)

    def __init__(self, text: str) -> None:
        self.query = text.encode()


class _PreparedCursor(psycopg.Cursor):
    """Server-side binding, and every statement prepared (Django turns
    psycopg's automatic preparation off)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        super().execute(query, params, prepare=True, binary=binary)
        if self._query is None:
            # psycopg records the query only when it does not run it prepared;
            # Django's query log (DEBUG, CaptureQueriesContext) reads it.
            self._query = _QueryText(query)
        return self


_Q, _R = TicketState.QUEUED.value, TicketState.RUNNING.value
_AVAILABLE, _T_RUNNING = EndpointState.AVAILABLE.value, TurnState.RUNNING.value

START_SQL = f"""
WITH msg AS (
    SELECT t.endpoint_id FROM tickets_ticket t WHERE t.id = %(ticket)s AND t.state = '{_Q}'
),
lk AS (
    SELECT l.endpoint_id, l.holder_id FROM endpoints_endpointlock l
    WHERE l.endpoint_id = (SELECT endpoint_id FROM msg)
    FOR UPDATE
),
tk AS (
    SELECT t.id FROM tickets_ticket t
    WHERE t.endpoint_id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      AND t.state = '{_Q}'
    ORDER BY t.id LIMIT 1
    FOR UPDATE SKIP LOCKED
),
ep AS (
    UPDATE endpoints_endpoint e SET turn_seq = e.turn_seq + 1
    WHERE e.id = (SELECT endpoint_id FROM lk WHERE holder_id IS NULL)
      AND e.state = '{_AVAILABLE}' AND EXISTS (SELECT 1 FROM tk)
    -- The clock is read once the lock row is ours: the turn lies inside its tenure.
    RETURNING {_EP_COLS}, clock_timestamp() AS now
),
tn AS (
    INSERT INTO endpoints_turn AS u (
        id, endpoint_id, ticket_id, seq, state, runner_kind, celery_task_id, worker,
        started_at, heartbeat_at, deadline_at, interrupt_requested_at, interrupt_reason,
        ended_at, stop_evidence, token_sha256)
    SELECT %(turn)s, ep.id, tk.id, ep.turn_seq, '{_T_RUNNING}', COALESCE(ep.runner->>'kind', ''),
        %(task)s, %(worker)s::jsonb, ep.now, ep.now,
        ep.now + make_interval(secs => ep.turn_budget_s), NULL, '', NULL, NULL, %(token_sha256)s
    FROM ep, tk
    RETURNING {_TURN_COLS}
),
-- No "holder_id IS NULL" here: an UPDATE tests its WHERE on the row as the
-- statement's snapshot saw it, which may still show the holder that released
-- the lock while lk waited. lk has the row locked and saw it free.
-- The rows are found by key through uncorrelated sub-selects of tn, never
-- joined to it: as a join the planner (estimating one queued ticket) scanned
-- the endpoint's whole queued index for the ticket, O(backlog) per start.
hold AS (
    UPDATE endpoints_endpointlock l SET holder_id = u.id, token = u.seq, acquired_at = u.started_at
    FROM tn u WHERE l.endpoint_id = (SELECT endpoint_id FROM tn)
),
tu AS (
    UPDATE tickets_ticket t
    SET state = '{_R}', turn_id = u.id, updated_at = u.started_at, version = t.version + 1
    FROM tn u WHERE t.id = (SELECT ticket_id FROM tn) AND t.state = '{_Q}'
    RETURNING {_TICKET_COLS}
),
ev AS (
    INSERT INTO tickets_ticketevent (
        ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
    SELECT t.id, 'turn_started', '{_Q}', '{_R}', %(actor)s, u.id,
        jsonb_build_object('seq', u.seq),
        u.started_at
    FROM tu t, tn u
    -- Every event wakes its ticket's watchers (tickets/waits.py) at commit:
    -- evaluated for the row inserted, though nothing reads it.
    RETURNING pg_notify('claimcheck_ticket', ticket_id::text)
),
-- The message was used up without starting its ticket: the next release
-- publishes it (lock held, endpoint not available, or an older ticket first).
mk AS (
    UPDATE tickets_ticket t SET needs_dispatch = true
    WHERE t.id = %(ticket)s AND t.state = '{_Q}'
      AND EXISTS (SELECT 1 FROM lk)
      AND (EXISTS (SELECT 1 FROM lk WHERE holder_id IS NOT NULL)
           OR (EXISTS (SELECT 1 FROM tk)
               AND NOT EXISTS (SELECT 1 FROM tn WHERE tn.ticket_id = %(ticket)s)))
),
-- The worker registry: this pool process now runs the turn (no row outside a worker).
sl AS (
    INSERT INTO endpoints_workerslot (worker_id, pid, turn_id, since, updated_at)
    SELECT w.id, %(pid)s, u.id, u.started_at, u.started_at
    FROM endpoints_worker w, tn u WHERE w.name = %(node)s
    ON CONFLICT (worker_id, pid) DO UPDATE
    SET turn_id = EXCLUDED.turn_id, since = EXCLUDED.since, updated_at = EXCLUDED.updated_at
)
SELECT ep.*, u.*, t.* FROM ep, tn u, tu t
"""


def start(
    *,
    ticket_id,
    turn_id,
    celery_task_id: str,
    worker: dict,
    token_sha256: str,
    actor: str,
    slot: tuple[str, int] | None = None,
) -> tuple[Endpoint, Turn, Ticket] | None:
    """Run the start statement; the endpoint, turn and ticket as written, or
    None when no turn started (the marks are already written). ``slot``:
    the worker's node name and this process's pid, whose registry slot the
    statement points at the new turn."""
    node, pid = slot or ("", 0)
    row = _execute(
        START_SQL,
        {
            "ticket": ticket_id,
            "turn": turn_id,
            "task": celery_task_id or "",
            "worker": json.dumps(worker),
            "token_sha256": token_sha256,
            "actor": actor,
            "node": node,
            "pid": pid,
        },
    )
    if row is None:
        return None
    a = len(_EP_NAMES)
    b = a + 1 + len(_TURN_NAMES)
    endpoint = _rows_to(Endpoint, _EP_NAMES, row[:a])
    turn = _rows_to(Turn, _TURN_NAMES, row[a + 1 : b])
    ticket = _rows_to(Ticket, _TICKET_NAMES, row[b:])
    turn.endpoint, turn.ticket, ticket.turn = endpoint, ticket, turn
    return endpoint, turn, ticket


_PENDING, _AWAITING = DeliveryState.PENDING.value, DeliveryState.AWAITING_APPROVAL.value

FINISH_SQL = f"""
WITH tk AS (
    SELECT t.id, t.input, COALESCE(t.requester->>'webhook_url', '') AS url, t.approved_at
    FROM tickets_ticket t
    WHERE t.id = %(ticket)s AND t.state = '{_R}' AND t.turn_id = %(turn)s
      AND t.parent_id IS NULL AND t.rerun_of_id IS NULL AND t.return_to_id IS NULL
      AND t.callback_for_id IS NULL AND t.callback_state = '{CallbackState.NONE.value}'
    FOR UPDATE
),
lk AS (
    SELECT l.endpoint_id FROM endpoints_endpointlock l
    WHERE l.endpoint_id = %(endpoint)s AND l.holder_id = %(turn)s AND l.token = %(seq)s
      AND EXISTS (SELECT 1 FROM tk)
    FOR UPDATE
),
tn AS (
    UPDATE endpoints_turn u SET state = %(turn_state)s, ended_at = %(now)s
    WHERE u.id = %(turn)s AND u.seq = %(seq)s AND u.state = '{_T_RUNNING}'
      AND EXISTS (SELECT 1 FROM lk)
    RETURNING u.id, u.seq, u.ticket_id
),
ce AS (
    INSERT INTO endpoints_contextentry (
        endpoint_id, turn_id, ticket_id, seq, input, result, artifacts, created_at)
    SELECT %(endpoint)s, u.id, k.id, u.seq, k.input, %(context)s::jsonb, %(ctx_artifacts)s::jsonb,
        %(now)s
    FROM tn u, tk k
),
d AS (
    SELECT k.url, CASE WHEN e.requires_approval AND k.approved_at IS NULL
                       THEN '{_AWAITING}' ELSE '{_PENDING}' END AS state
    FROM tn, tk k, endpoints_endpoint e WHERE e.id = %(endpoint)s
),
dl AS (
    INSERT INTO tickets_delivery (
        id, ticket_id, mode, url, attempts, next_attempt_at, last_error, delivered_at, created_at)
    SELECT %(delivery)s, %(ticket)s, CASE WHEN d.url <> '' THEN 'webhook' ELSE 'pull' END, d.url, 0,
        CASE WHEN d.url <> '' AND d.state = '{_PENDING}' THEN %(now)s::timestamptz END, '', NULL,
        %(now)s
    FROM d
    RETURNING id, mode, next_attempt_at IS NOT NULL AS due
),
tu AS (
    UPDATE tickets_ticket t
    SET state = %(to)s, updated_at = %(now)s, finished_at = %(now)s, version = t.version + 2,
        delivery_state = (SELECT state FROM d), {{sets}}
    WHERE t.id = (SELECT ticket_id FROM tn) AND t.state = '{_R}'
    RETURNING t.id
),
-- One event for the one transaction: the terminal event records the
-- delivery it opened, in the words of lifecycle.transition's.
ev AS (
    INSERT INTO tickets_ticketevent (
        ticket_id, kind, from_state, to_state, actor, turn_id, detail, at)
    SELECT t.id, %(kind)s, '{_R}', %(to)s, %(actor)s, %(turn)s,
        %(detail)s::jsonb || jsonb_build_object('delivery_opened', jsonb_build_object(
            'mode', dl.mode, 'state', d.state)),
        %(now)s
    FROM tu t, dl, d
),
rl AS (
    UPDATE endpoints_endpointlock l SET holder_id = NULL, token = NULL, acquired_at = NULL
    FROM tn u WHERE l.endpoint_id = %(endpoint)s AND l.holder_id = u.id
    RETURNING l.endpoint_id
),
-- dispatch_next: unmark the oldest marked queued ticket, or wake the dispatcher.
w AS (
    SELECT t.id FROM tickets_ticket t
    WHERE t.endpoint_id = (SELECT endpoint_id FROM rl) AND t.state = '{_Q}' AND t.needs_dispatch
    ORDER BY t.id LIMIT 1
),
nx AS (
    UPDATE tickets_ticket t SET needs_dispatch = false
    WHERE t.id = (SELECT id FROM w) AND t.state = '{_Q}' AND t.needs_dispatch RETURNING t.id
),
-- Nothing unmarked (a mark another start wrote while this statement waited
-- for the lock row is not in its snapshot): the dispatcher looks again.
nt AS (
    SELECT pg_notify('claimcheck_dispatch', '') FROM rl WHERE NOT EXISTS (SELECT 1 FROM nx)
),
-- The worker registry: this pool process runs nothing any more.
sl AS (
    INSERT INTO endpoints_workerslot (worker_id, pid, turn_id, since, updated_at)
    SELECT w.id, %(pid)s, NULL, %(now)s, %(now)s FROM endpoints_worker w, tn WHERE w.name = %(node)s
    ON CONFLICT (worker_id, pid) DO UPDATE
    SET turn_id = EXCLUDED.turn_id, since = EXCLUDED.since, updated_at = EXCLUDED.updated_at
)
SELECT t.id, (SELECT id FROM nx), (SELECT count(*) FROM nt),
    pg_notify('claimcheck_ticket', t.id::text) IS NULL, dl.id, dl.due, (SELECT count(*) FROM rl)
FROM tu t, dl
"""

_FINISH_SUCCESS = FINISH_SQL.replace(
    "{sets}", "result = %(result)s::jsonb, artifacts = %(artifacts)s::jsonb"
)
_FINISH_FAILURE = FINISH_SQL.replace("{sets}", "error = %(error)s::jsonb")


def _json(value: Any) -> str | None:
    # The ORM writes a JSONField's None as SQL NULL; so does this.
    return None if value is None else json.dumps(value)


def finish(
    *,
    ticket_id,
    endpoint_id: int,
    turn_id,
    seq: int,
    success: bool,
    result: Any = None,
    artifacts: list | None = None,
    error: Any = None,
    actor: str,
    detail: dict[str, Any],
    delivery_id,
    now: datetime,
    slot: tuple[str, int] | None = None,
) -> tuple[Any, Any, bool] | None:
    """Run the finish statement. Returns (next ticket to publish or None,
    delivery id, whether the delivery is due now), or None when a guard did
    not hold and nothing was written. ``slot``: the worker's node name and
    this process's pid, whose registry slot the statement marks idle."""
    node, pid = slot or ("", 0)
    params = {
        "ticket": ticket_id,
        "endpoint": endpoint_id,
        "turn": turn_id,
        "seq": seq,
        "now": now,
        "actor": actor,
        "detail": json.dumps(detail),
        "delivery": delivery_id,
        "node": node,
        "pid": pid,
    }
    if success:
        artifacts = artifacts or []
        params.update(
            turn_state=TurnState.COMPLETED.value,
            to=TicketState.SUCCEEDED.value,
            kind="turn_completed",
            result=_json(result),
            artifacts=json.dumps(artifacts),
            context=_json(result),
            ctx_artifacts=json.dumps(artifacts),
        )
        sql = _FINISH_SUCCESS
    else:
        params.update(
            turn_state=TurnState.FAILED.value,
            to=TicketState.FAILED.value,
            kind="turn_failed",
            error=_json(error),
            context=json.dumps({"error": error}),
            ctx_artifacts="[]",
        )
        sql = _FINISH_FAILURE
    row = _execute(sql, params)
    if row is None:
        return None
    _ticket, next_ticket, _woke, _notified, delivery, due, released = row
    if released != 1:  # the lock row was checked in the same statement: a miss is a bug
        raise RuntimeError(f"lock of endpoint {endpoint_id} not released by turn {turn_id}")
    return next_ticket, delivery, bool(due)
