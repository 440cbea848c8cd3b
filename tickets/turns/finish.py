"""The call of a turn's finish (tickets/sql/claimcheck_finish_turn.sql) and
what it reports, read by column name. What to finish with, the work of
other services around it and the answer to the runner are the runtime's
(runtime/turns/finish.py)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from core.ids import new_id
from core.sqlfunctions import call_cursor

from ..models import Turn
from .start import Credentials, Started, start_params, started_columns, started_from

# Called with named arguments (a parameter added with a default shifts no
# caller); the params dict below names each. The columns of the next turn
# it started come only when asked to start one.
_FINISH_CALL = (
    " FROM claimcheck_finish_turn(p_ticket => %(ticket)s, p_endpoint => %(endpoint)s,"
    " p_turn => %(turn)s, p_seq => %(seq)s, p_kind => %(kind)s, p_result => %(result)s::jsonb,"
    " p_artifacts => %(artifacts)s::jsonb, p_error => %(error)s::jsonb,"
    " p_evidence => %(evidence)s::jsonb, p_children => %(children)s::jsonb,"
    " p_continuation => %(continuation)s::jsonb, p_stale_detail => %(stale_detail)s::jsonb,"
    " p_digest => %(digest)s, p_source => %(source)s, p_ran_s => %(ran_s)s,"
    " p_delivery => %(delivery)s, p_node => %(node)s, p_pid => %(pid)s,"
    " p_next_turn => %(next_turn)s, p_task => %(task)s, p_worker => %(worker)s::jsonb,"
    " p_next_token_sha256 => %(next_token_sha256)s, p_next_actor => %(next_actor)s) r"
)
# What the function reports, read by name (Written's fields in order).
WRITTEN_COLUMNS = (
    "o_status",
    "o_state",
    "o_turn_state",
    "o_next",
    "o_delivery",
    "o_due",
    "o_reason",
)
_WRITTEN = ", ".join(f"r.{c}" for c in WRITTEN_COLUMNS)
_FINISH_SQL = f"SELECT {_WRITTEN}{_FINISH_CALL}"
_FINISH_START_SQL = (
    f"SELECT {_WRITTEN}, {started_columns('o_next_endpoint', 'o_next_turn', 'o_next_ticket')}"
    f"{_FINISH_CALL}"
)


@dataclass(frozen=True)
class Written:
    """What ``claimcheck_finish_turn`` reports."""

    status: str  # finished | duplicate | stale | missing
    ticket_state: str | None
    turn_state: str | None
    next_ticket: uuid.UUID | None
    delivery: uuid.UUID | None
    due: bool
    reason: str
    started: Started | None = None


def _json(value: Any) -> str | None:
    # The ORM writes a JSONField's None as SQL NULL; so does this.
    return None if value is None else json.dumps(value)


def finish(
    *,
    turn: Turn,
    seq: int,
    kind: str,
    result: Any,
    artifacts: list | None,
    error: Any,
    evidence: Any,
    children: list[str] | None,
    continuation: Any,
    stale_detail: dict[str, Any],
    digest: str,
    source: str,
    ran_s: float | None,
    slot: tuple[str, int] | None,
    next_turn: Credentials | None,
) -> Written:
    """One call of ``claimcheck_finish_turn`` for the exact turn ``turn``
    (its ticket and endpoint, the ``seq`` it was given): the outcome
    applied, or refused as stale, the lock released; with ``next_turn`` the
    endpoint's next turn started under those credentials in the same
    statement (``Written.started``)."""
    node, pid = slot or ("", 0)
    # The next turn's (claimcheck_start_turn's after the ticket's, but for
    # the slot: above), when this worker starts it.
    start = start_params(next_turn)[:5] if next_turn is not None else [None] * 5
    params = {
        "ticket": turn.ticket_id,
        "endpoint": turn.endpoint_id,
        "turn": turn.id,
        "seq": seq,
        "kind": kind,
        "result": _json(result),
        "artifacts": json.dumps(artifacts or []),
        "error": _json(error),
        "evidence": _json(evidence) if kind == "stopped" else None,
        "children": json.dumps(children or []),
        "continuation": _json(continuation),
        "stale_detail": json.dumps(stale_detail),
        "digest": digest,
        "source": source,
        "ran_s": ran_s,
        "delivery": new_id(),
        "node": node,
        "pid": pid,
        **dict(
            zip(
                ("next_turn", "task", "worker", "next_token_sha256", "next_actor"),
                start,
                strict=True,
            )
        ),
    }
    began = time.monotonic()
    with call_cursor() as cur:
        cur.execute(_FINISH_START_SQL if next_turn is not None else _FINISH_SQL, params)
        row = cur.fetchone()
        names = [column.name for column in cur.description]
    n = len(WRITTEN_COLUMNS)
    assert tuple(names[:n]) == WRITTEN_COLUMNS, names  # the SELECT list above
    written = Written(*row[:n])
    if next_turn is not None:
        written = replace(written, started=started_from(row[n:], next_turn, began=began))
    return written
