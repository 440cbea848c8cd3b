"""Admission: a request becomes a ticket, or finds the ticket it already is.

The transition is one database function, ``claimcheck_admit_v2``
(tickets/sql/claimcheck_admit_v2.sql, its parts in the files it names):
resolve the endpoint, find the ticket holding the key, check quarantine,
the busy policy and the circuit breaker, insert the ticket and its event
(and its count on a trace it joins). A new ticket or a duplicate is one round trip; the
function's answer for anything else is turned here into the documented
error.
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
from django.db import connection, transaction
from django.utils import timezone

from core import inputs, observe
from core.canonical import canonical_json
from core.dispatch import DISPATCH_CHANNEL
from core.errors import (
    CircuitOpen,
    DedupeConflict,
    EndpointBusy,
    EndpointPaused,
    EndpointQuarantined,
    Forbidden,
    Invalid,
    NotFound,
    TooLarge,
    TraceBudgetExhausted,
)
from core.ids import new_id
from core.limits import DEDUPE_KEY_CHARS, TRACE_ID_CHARS
from core.sqlfunctions import call_cursor
from core.wakes import wake
from endpoints.models import Endpoint
from endpoints.selectors import may_submit, owned_endpoint_ids, quarantine_case

from . import rights, superseding
from .models import (
    CallbackState,
    DeliveryState,
    ObligationState,
    Ticket,
    TicketState,
    Turn,
)
from .selectors import visible_tickets

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


def validate_trace_id(trace_id: str | None) -> str | None:
    if trace_id is not None and (
        not isinstance(trace_id, str)
        or not 1 <= len(trace_id) <= TRACE_ID_CHARS
        or not trace_id.isprintable()
    ):
        raise Invalid(f"trace_id must be 1 to {TRACE_ID_CHARS} printable characters")
    return trace_id


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
    asked_by: rights.AskingTurn | None = None,
    actor: str = "",
) -> Admitted:
    """Admit one ticket (DESIGN.md flow 1).

    ``submitter`` is the user asking (an API key's user): the ticket is
    theirs to see, a restricted endpoint (or ``return_to``) must let them
    submit (403 otherwise, before any lookup by dedupe key, so a refused
    caller learns nothing about existing tickets), a ``parent`` must be a
    ticket they may see, and a duplicate they may not see is a
    ``dedupe_conflict`` that names no ticket. Admissions by the runtime
    itself have no submitter: a child a turn asks for names that turn in
    ``asked_by`` and goes only where ``rights.require_child_rights`` lets
    it (403 otherwise); a callback home, an owner's re-run or approval and
    an owner's retry are the people's own acts on their endpoints.

    1. Check the caps and the dedupe key's shape; a parent the submitter
       may not see is 404.
    2. ``claimcheck_admit_v2``, one statement, atomic on its own (no BEGIN or
       COMMIT round trips in autocommit): resolve the endpoint (address or
       alias) and ``return_to``; a restricted one sends the caller back here
       to ask ``may_submit`` first; look up ``(endpoint, dedupe_key)`` in any
       state (same input -> duplicate, different -> 409); join the parent's
       trace; fail closed on quarantine; apply the busy policy and the
       circuit breaker (the trace row locked; counted per party, the
       submitter or its ancestors'; refused past the hard limit before
       anything is written, flagged past the soft one); insert the ticket,
       its event and, when it joins a trace, the trace's count (a root that
       opens its own trace writes no trace row). The unique constraint
       decides a race: the loser waits for the winner's commit and returns
       its row.
    3. No broker publish: the ticket is marked ``needs_dispatch`` and the
       dispatcher (runtime/dispatcher.py) is woken after the commit
       (core/wakes.py); its poll serves a wake that is lost.
    """
    if not isinstance(input, dict):
        raise Invalid("input must be a JSON object")
    # The one bound on every value (core/inputs.py), for callers that are
    # not the API's parser (a runner's children, the console, commands):
    # what is admitted is what every runner can be handed.
    bound = inputs.max_depth()
    inputs.check_value(input, path="input", depth=bound)
    body = canonical_json(input)
    if len(body) > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge(
            f"input is {len(body)} bytes; the cap is {settings.TICKET_MAX_INPUT_BYTES}",
            limit=settings.TICKET_MAX_INPUT_BYTES,
        )
    dedupe_key = validate_dedupe_key(dedupe_key)
    validate_trace_id(trace_id)
    requester = requester or {}
    inputs.check_value(requester.get("metadata"), path="requester.metadata", depth=bound)
    if len(canonical_json(requester)) > settings.TICKET_MAX_INPUT_BYTES:
        raise TooLarge("requester metadata is over the input cap")
    inputs.check_value(continuation, path="return_to.continuation", depth=bound)
    sha = hashlib.sha256(body).hexdigest()
    if submitter is not None:
        submitted_by_id = submitter.id
    if asked_by is not None and (submitter is not None or parent_id is None):
        raise ValueError("a ticket asked for by a turn has a parent and no submitter")

    return _admit(
        address=endpoint,
        input_json=body.decode(),
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
        asked_by=asked_by,
        actor=actor,
    )


# Every field of the ticket, for a duplicate, which the function returns as
# one JSON value (to_jsonb): as forty-odd columns, every admission, new ones
# included (NULLs there), would pay to describe and load them, where one
# JSON column costs a new ticket next to nothing. _ticket_from_row reads it
# back.
_TICKET_FIELDS = tuple(Ticket._meta.concrete_fields)
_TICKET_ATTNAMES = [f.attname for f in _TICKET_FIELDS]
# A new ticket as _admitted builds it: all but its implied admission event's
# id and actor, which the function does not return (deferred: read if asked
# for, and never written back by a save of the instance).
_IMPLIED = ("admission_event", "admission_actor")
_ADMITTED_ATTNAMES = [a for a in _TICKET_ATTNAMES if a not in _IMPLIED]
# claimcheck_admit_v2: tickets/sql/claimcheck_admit_v2.sql.
# Named arguments (a parameter added with a default shifts no caller); its
# result read by column name (``Row``).
_ADMIT_PARAMS = (
    "id", "address", "dedupe_key", "sha", "input", "parent", "trace", "return_to",
    "continuation", "requester", "callback_for", "rerun_of", "submitted_by",
    "may_submit_restricted", "actor", "now", "due", "soft", "hard",
)  # fmt: skip
_JSONB = {"input", "continuation", "requester"}
_ADMIT_SQL = (
    "SELECT * FROM claimcheck_admit_v2("
    + ", ".join(
        f"p_{name} => %({name})s" + ("::jsonb" if name in _JSONB else "") for name in _ADMIT_PARAMS
    )
    + ")"
)

# One row of claimcheck_admit_v2's result, by column name without its ``o_``.
Row = dict[str, Any]


def _admit(
    *,
    address: str,
    input_json: str,
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
    asked_by: rights.AskingTurn | None,
    actor: str,
) -> Admitted:
    # The parent must be a ticket the submitter may see (a read; the
    # function reads its trace and depth itself).
    if (
        parent_id is not None
        and submitter is not None
        and not visible_tickets(submitter).filter(id=parent_id).exists()
    ):
        raise NotFound(f"parent ticket {parent_id} not found")
    now = timezone.now()
    ticket_id = new_id()
    params = {
        "id": ticket_id,
        "address": address,
        "dedupe_key": dedupe_key,
        "sha": sha,
        "input": input_json,
        "parent": parent_id,
        "trace": trace_id,
        "return_to": return_to,
        "continuation": None if continuation is None else json.dumps(continuation),
        "requester": json.dumps(requester),
        "callback_for": callback_for_id,
        "rerun_of": rerun_of_id,
        "submitted_by": submitted_by_id,
        # The runtime's own admissions (no submitter) may submit anywhere,
        # but for a turn's children (asked_by: their rights, below).
        "may_submit_restricted": submitter is None and asked_by is None,
        "actor": actor,
        "now": now,
        "due": now + timedelta(seconds=settings.OBLIGATION_UPDATE_INTERVAL_S),
        "soft": settings.TRACE_SOFT_LIMIT,
        "hard": settings.TRACE_HARD_LIMIT,
    }
    row = _call(params)
    if row["status"] == "restricted":
        # Who may submit to a restricted endpoint is the directory's rule,
        # asked before anything is looked up; then the function again.
        _require_submit(
            submitter,
            row,
            asked_by=asked_by,
            parent_id=parent_id,
            requested=(address, return_to),
        )
        params["may_submit_restricted"] = True
        row = _call(params)
    if row["status"] == "retry":
        # What refused the ticket changed while the function looked (a
        # busy endpoint went idle): once more, with the state as it is now.
        row = _call(params)
    status = row["status"]
    if status in ("admitted", "admitted_flagged"):
        # The ticket owes a dispatch: the dispatcher hears of it after the
        # commit, not from inside it (core/wakes.py says why).
        wake(DISPATCH_CHANNEL)
        _supersede_after_commit(row, ticket_id=ticket_id)
        return _admitted(row, ticket_id=ticket_id, params=params, input_json=input_json)
    if status == "existing":
        return _existing_row(row, dedupe_key=dedupe_key, sha=sha, submitter=submitter)
    raise _refusal(status, row, parent_id=parent_id)


def _supersede_after_commit(row: Row, *, ticket_id: uuid.UUID) -> None:
    """An ``interrupt`` endpoint's running turn, as the function read it at
    this admission, is asked to stop after the commit (tickets/superseding.py):
    never from inside a transaction that may still roll back."""
    data = row["row"]
    if data is None:
        return
    if isinstance(data, str | bytes):  # Django's jsonb loader leaves it text
        data = json.loads(data)
    running = data.get("supersede")
    if running:
        turn_id, seq = uuid.UUID(str(running["turn"])), int(running["seq"])
        transaction.on_commit(lambda: superseding.supersede(turn_id, seq, ticket_id))


# claimcheck_admit_v2's result columns without their ``o_``, read from the
# first call's description and kept: psycopg builds a ``Column`` object per
# column each time ``description`` is read, a share of admission's Python.
# A function's result cannot change under its name (PostgreSQL refuses it in
# place, and core/sqlfunctions.py refuses a file that would: a new result is
# a new versioned name), so the first call's columns are every call's; a row
# of another width is read afresh all the same.
_columns: tuple[str, ...] = ()


def _call(params: dict[str, Any]) -> Row:
    # One statement (in autocommit its own transaction), unprepared, so fine
    # behind PgBouncer in transaction mode. PL/pgSQL plans the function's
    # statements once per server session.
    global _columns
    with call_cursor() as cur:
        cur.execute(_ADMIT_SQL, params)
        values = cur.fetchone()
        if len(_columns) != len(values):
            _columns = tuple(c.name.removeprefix("o_") for c in cur.description)
        return dict(zip(_columns, values, strict=True))


def _require_submit(
    submitter: AbstractBaseUser | None,
    row: Row,
    *,
    asked_by: rights.AskingTurn | None,
    parent_id: uuid.UUID | None,
    requested: tuple[str, str | None],
) -> None:
    """``may_submit`` for the endpoint and the return_to as the function read
    them (id, address, submit_restricted, owners): one query for the check.
    A turn's child: the rights it carries (``rights.require_child_rights``)."""
    # In the model's field order: from_db reads partial values in that order.
    wanted = {"id", "address", "submit_restricted", "owners_id"}
    names = [f.attname for f in Endpoint._meta.concrete_fields if f.attname in wanted]
    data = row["row"]
    if isinstance(data, str | bytes):  # Django's jsonb loader leaves it text
        data = json.loads(data)
    for i, fields in enumerate(data):
        if fields is None:
            continue
        target = Endpoint.from_db(connection.alias, names, [fields[n] for n in names])
        if asked_by is not None:
            rights.require_child_rights(
                asked_by=asked_by,
                parent_id=parent_id,
                target=target,
                requested=requested[i] or target.address,
                return_to=i == 1,
            )
        elif not may_submit(submitter, target):
            raise Forbidden(f"you may not submit tickets to {target.address}")


def _refusal(status: str, row: Row, *, parent_id: uuid.UUID | None) -> Exception:
    """The documented error for what the function refused (it wrote nothing)."""
    address = row["address"]
    if status == "endpoint_not_found":
        return NotFound(f"endpoint {address!r} not found")
    if status == "parent_not_found":
        return NotFound(f"parent ticket {parent_id} not found")
    if status == "trace_mismatch":
        return Invalid("trace_id differs from the parent's trace")
    if status == "quarantined":
        case = quarantine_case(row["endpoint"])
        return EndpointQuarantined(
            f"endpoint {address} is quarantined until an owner decides",
            case=str(case) if case else None,
        )
    if status == "paused":
        return EndpointPaused(
            f"endpoint {address} is paused by its owners and rejects new work until resumed"
        )
    if status == "busy":
        return EndpointBusy(f"endpoint {address} is running a turn and rejects new work")
    if status == "circuit_open":
        return CircuitOpen(
            f"trace {row['trace']} holds {settings.TRACE_HARD_LIMIT} tickets of this party "
            "(the submitter whose tickets they are or descend from), its hard limit",
            trace_id=row["trace"],
            limit=settings.TRACE_HARD_LIMIT,
        )
    if status == "trace_budget_exhausted":
        return TraceBudgetExhausted(
            f"trace {row['trace']} spent its budget and takes no new tickets",
            trace_id=row["trace"],
        )
    return RuntimeError(f"claimcheck_admit_v2 answered {status!r}")


def _admitted(
    row: Row, *, ticket_id: uuid.UUID, params: dict[str, Any], input_json: str
) -> Admitted:
    """The ticket as the function inserted it, loaded as the ORM loads a row
    (from_db: positional, without the keyword handling of Ticket(**fields),
    a noticeable share of an admission's time). The fields it leaves out are
    NULL, but for the implied admission event's (deferred)."""
    status, endpoint_id, canonical_address = row["status"], row["endpoint"], row["address"]
    return_to_id, trace, depth, root = row["return_to"], row["trace"], row["depth"], row["root"]
    if status == "admitted_flagged":
        log.warning("trace %s passed its soft limit (%s)", trace, settings.TRACE_SOFT_LIMIT)
    now = params["now"]
    values = {
        "id": ticket_id,
        "endpoint_id": endpoint_id,
        "dedupe_key": params["dedupe_key"],
        "input_sha256": params["sha"],
        "input": json.loads(input_json),
        "parent_id": params["parent"],
        "trace_id": trace,
        "depth": depth,
        "state": TicketState.QUEUED.value,
        "artifacts": [],
        "return_to_id": return_to_id,
        "continuation": None
        if params["continuation"] is None
        else json.loads(params["continuation"]),
        "callback_for_id": params["callback_for"],
        "rerun_of_id": params["rerun_of"],
        "requester": json.loads(params["requester"]),
        "submitted_by_id": params["submitted_by"],
        "callback_state": (CallbackState.PENDING if return_to_id else CallbackState.NONE).value,
        "delivery_state": DeliveryState.NONE.value,
        "needs_dispatch": True,
        "obligation_state": (ObligationState.OPEN if root else ObligationState.NONE).value,
        "obligation_due_at": params["due"] if root else None,
        "obligation_overdue": False,
        "obligation_note": "",
        "created_at": now,
        "updated_at": now,
    }
    alias = connection.alias
    ticket = Ticket.from_db(alias, _ADMITTED_ATTNAMES, [values.get(a) for a in _ADMITTED_ATTNAMES])
    # The endpoint as the function read it.
    ticket.endpoint = Endpoint.from_db(alias, ["id", "address"], [endpoint_id, canonical_address])
    if return_to_id is not None:
        ticket.return_to = Endpoint.from_db(
            alias, ["id", "address"], [return_to_id, row["return_to_address"]]
        )
    return Admitted(ticket=ticket, duplicate=False)


def _existing_row(
    row: Row, *, dedupe_key: str, sha: str, submitter: AbstractBaseUser | None
) -> Admitted:
    """The ticket already holding the key, whole from the function's row,
    with whether the submitter may see it: a duplicate or a conflict costs
    no further round trip. ``owned`` is ``claimcheck_ticket_visible`` as the
    statement answered it for the submitter (the rule's one home), which
    knows of the submitter's endpoints only this one: one who owns every
    endpoint (staff, ``owned_endpoint_ids`` None) is told here."""
    existing = _ticket_from_row(row)
    visible = submitter is None or bool(row["owned"]) or owned_endpoint_ids(submitter) is None
    return _duplicate(
        existing, dedupe_key=dedupe_key, sha=sha, submitter=submitter, visible=visible
    )


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


def _ticket_from_row(row: Row) -> Ticket:
    """The existing ticket from the statement's duplicate branch (its row as
    one JSON value), as the ORM would load it, with its endpoint, turn and
    return_to as far as the payload reads them (any other field of those
    loads on access)."""
    endpoint_address = row["address"]
    turn_seq, turn_state = row["turn_seq"], row["turn_state"]
    return_to_address, data = row["return_to_address"], row["row"]
    if isinstance(data, str | bytes):  # Django's jsonb loader leaves it text
        data = json.loads(data)
    values = [
        value if convert is None or value is None else convert(value)
        for column, convert in _TICKET_FROM_JSON
        for value in (data[column],)
    ]
    alias = connection.alias
    ticket = Ticket.from_db(alias, _TICKET_ATTNAMES, values)
    ticket.endpoint = Endpoint.from_db(
        alias, ["id", "address"], [ticket.endpoint_id, endpoint_address]
    )
    if ticket.turn_id is not None:
        ticket.turn = Turn.from_db(
            alias, ["id", "seq", "state"], [ticket.turn_id, turn_seq, turn_state]
        )
    if ticket.return_to_id is not None:
        ticket.return_to = Endpoint.from_db(
            alias, ["id", "address"], [ticket.return_to_id, return_to_address]
        )
    return ticket


def _duplicate(
    ticket: Ticket,
    *,
    dedupe_key: str,
    sha: str,
    submitter: AbstractBaseUser | None,
    visible: bool,
) -> Admitted:
    """The ticket already holding the key: returned as the duplicate when
    the inputs match, else 409. To a submitter who may not see it, it does
    not exist: the key is taken, and that is all the conflict says (the
    key's namespace is the endpoint's, shared by everyone who submits).
    ``visible``: ``may_see`` as the caller decided it (the function's
    statement answers it)."""
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
