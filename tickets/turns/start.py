"""Starting a turn: the lock row, the fencing token (``seq``), the Turn row
and its token; ``queued -> running``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Model

from core import observe
from core.ids import new_id
from core.sqlfunctions import call_cursor
from core.wakes import wake
from endpoints.models import Endpoint
from tickets.models import Ticket, TicketState, Turn, TurnState
from tickets.waits import TICKET_CHANNEL

log = logging.getLogger(__name__)


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


@dataclass
class Started:
    turn: Turn
    ticket: Ticket
    endpoint: Endpoint
    # The turn's credential for the turn API, for its runner only: the Turn
    # row keeps just its SHA-256 (token_sha256).
    token: str = field(default="", repr=False)
    # The start statement already named this worker's slot on the turn (Turn.slot).
    slot_recorded: bool = False
    # The worker's monotonic clock just before it sent the statement that
    # started the turn: it precedes the turn's started_at, so the run time
    # measured from it (finish_turn's ran_s) is never short.
    began: float = 0.0


def turn_token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _select(model: type[Model], column: str) -> str:
    """The composite's fields by name, in the model's order."""
    return ", ".join(f'(r.{column})."{f.column}"' for f in model._meta.concrete_fields)


_PARTS = (
    (Endpoint, [f.attname for f in Endpoint._meta.concrete_fields]),
    (Turn, [f.attname for f in Turn._meta.concrete_fields]),
    (Ticket, [f.attname for f in Ticket._meta.concrete_fields]),
)


def _load(model: type[Model], names: list[str], values: tuple) -> Model:
    """A model instance from the columns the function returned, converted the
    way the ORM converts them (json text to Python)."""
    converted = []
    for name, value in zip(names, values, strict=True):
        field = model._meta.get_field(name) if not name.endswith("_id") else None
        if field is not None and hasattr(field, "from_db_value") and isinstance(value, str):
            value = field.from_db_value(value, None, connection)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


@dataclass(frozen=True)
class Credentials:
    """What a start writes for the turn it may start: its id, the SHA-256 of
    a fresh random token (the runner gets the token itself), the message's
    Celery task id, this worker's identity, and its registry slot."""

    turn_id: uuid.UUID
    token: str = field(repr=False)
    celery_task_id: str
    worker: dict[str, Any]
    slot: tuple[str, int] | None

    @classmethod
    def new(cls, *, celery_task_id: str = "", slot: tuple[str, int] | None = None) -> Credentials:
        return cls(
            turn_id=new_id(),
            token=secrets.token_urlsafe(32),
            celery_task_id=celery_task_id or "",
            worker=worker_identity(),
            slot=slot,
        )

    @property
    def actor(self) -> str:
        return f"worker:{self.worker['host']}:{self.worker['pid']}"


# The columns of the rows a start returns (claimcheck_start_turn's
# o_endpoint, o_turn and o_ticket; claimcheck_finish_turn's o_next_*), by name.
def started_columns(endpoint: str, turn: str, ticket: str) -> str:
    return f"{_select(Endpoint, endpoint)}, {_select(Turn, turn)}, {_select(Ticket, ticket)}"


# claimcheck_start_turn: tickets/sql/claimcheck_start_turn.sql.
_START_SQL = (
    f"SELECT {started_columns('o_endpoint', 'o_turn', 'o_ticket')} "
    "FROM claimcheck_start_turn(p_ticket => %s, p_turn => %s, p_task => %s,"
    " p_worker => %s::jsonb, p_token_sha256 => %s, p_actor => %s, p_node => %s, p_pid => %s) r"
)


def started_from(row: tuple, credentials: Credentials, *, began: float) -> Started | None:
    """The turn a start statement returned (its endpoint, turn and ticket
    columns, ``started_columns``), or None when it started none."""
    if row is None or row[len(_PARTS[0][1])] is None:  # no turn id: none started
        return None
    loaded, at = [], 0
    for model, names in _PARTS:
        loaded.append(_load(model, names, row[at : at + len(names)]))
        at += len(names)
    endpoint, turn, ticket = loaded
    turn.endpoint, turn.ticket, ticket.turn = endpoint, ticket, turn
    return Started(
        turn=turn,
        ticket=ticket,
        endpoint=endpoint,
        token=credentials.token,
        slot_recorded=credentials.slot is not None,
        began=began,
    )


def report_started(started: Started) -> None:
    """The ``turn_started`` transition's metrics (counted at commit) and the
    log context of the turn from here on."""
    observe.transition(
        ticket_id=started.ticket.id,
        expected=TicketState.QUEUED,
        to=TicketState.RUNNING,
        kind="turn_started",
        turn_id=started.turn.id,
        fields={"turn": started.turn},
    )


def start_turn(
    *, ticket_id: uuid.UUID, celery_task_id: str = "", slot: tuple[str, int] | None = None
) -> Started | None:
    """Start the next turn of the endpoint a dispatch message names
    (DESIGN.md flow 2). Returns None when there is nothing to do.

    One call of the database function ``claimcheck_start_turn``, one
    statement and, in autocommit, its own transaction:

    1. A ticket no longer ``queued`` means a duplicate message: do nothing.
    2. Lock the endpoint's lock row. Held, or endpoint quarantined or paused:
       leave the ticket queued, marked ``needs_dispatch`` (the release
       publishes it; a quarantined or paused endpoint dispatches nothing
       until its owner's decision or resume).
    3. Take the endpoint's *oldest* queued ticket (FIFO per endpoint), skipping
       rows another transaction holds (a cancel in flight). If that is not the
       message's ticket, the message's ticket is marked too.
    4. ``seq = ++turn_seq`` while the endpoint is ``available`` and not
       paused (the same UPDATE: a pause is ordered before or after it); create the
       Turn with the SHA-256 of a fresh random token (the runner gets the
       token itself); make it the lock holder and the ticket's registered
       turn; ticket ``queued -> running`` with its event; the turn names
       the worker's slot (``slot``: node name and pid; tickets/turns/slots.py).

    The function's comments say why each guard holds under READ COMMITTED.
    A worker that finishes a turn starts the endpoint's next one with the
    same function, inside its finish (``finish_turn`` with ``start_next``).
    """
    began = time.monotonic()
    credentials = Credentials.new(celery_task_id=celery_task_id, slot=slot)
    with call_cursor() as cur:
        cur.execute(_START_SQL, [ticket_id, *start_params(credentials)])
        row = cur.fetchone()
    started = started_from(row, credentials, began=began)
    if started is not None:
        report_started(started)
        wake(TICKET_CHANNEL, str(started.ticket.id))  # after commit: core/wakes.py
    return started


def start_params(credentials: Credentials) -> list[Any]:
    """claimcheck_start_turn's parameters after the ticket's, in its order
    (claimcheck_finish_turn's last ones name the same, as p_next_*)."""
    node, pid = credentials.slot or ("", 0)
    return [
        credentials.turn_id,
        credentials.celery_task_id,
        json.dumps(credentials.worker),
        turn_token_sha256(credentials.token),
        credentials.actor,
        node,
        pid,
    ]


def started_by(celery_task_id: str) -> Started | None:
    # Running turns only: the partial index on active turns keeps this small.
    turn = (
        Turn.objects.select_related("ticket", "endpoint")
        .filter(state=TurnState.RUNNING, celery_task_id=celery_task_id)
        .first()
    )
    if turn is None or turn.worker != worker_identity():
        return None
    # The token made by the lost attempt died with its reply: issue a new one
    # (only the hash is stored, so the old one cannot be recovered).
    token = secrets.token_urlsafe(32)
    if not Turn.objects.filter(id=turn.id, state=TurnState.RUNNING).update(
        token_sha256=turn_token_sha256(token)
    ):
        return None
    return Started(turn=turn, ticket=turn.ticket, endpoint=turn.endpoint, token=token)
