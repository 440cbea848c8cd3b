"""Which worker pool process runs a turn: the ledger's record of it, on the
turn's row (``Turn.slot``, ``Turn.released_at``).

A worker's pool process is a slot, named ``"<node>:<pid>"`` (the Celery
node name of its worker and its pid). The turn's start names it on the turn
(claimcheck_start_turn, ``p_node`` and ``p_pid``); the finish that process
sends lets go of it (claimcheck_finish_write, the same UPDATE that ends the
turn). So a start and a finish write nothing but the ledger's rows, and no
extra statement. A slot runs the newest turn started in it until it lets go
of it, whatever that turn's state: a turn quarantined by the sweep while
its callable still runs holds its slot.

The runtime's worker registry (runtime/registry.py) calls these for what
happens outside those two statements, and reads the slots' turns for its
views and for a stop's check before its kill (runtime/selectors.py)."""

from __future__ import annotations

import uuid

from django.db import connection

from ..models import Turn


def slot_key(node: str, pid: int) -> str:
    """The slot's name as the start writes it (``p_node || ':' || p_pid``)."""
    return f"{node}:{pid}"


def occupy(turn_id: uuid.UUID, *, node: str, pid: int) -> None:
    """The slot runs ``turn_id``: for a turn whose start did not name it (a
    start found again by its task id after a lost reply)."""
    Turn.objects.filter(id=turn_id).update(slot=slot_key(node, pid), released_at=None)


# The newest turn of each slot lets go, once; an older turn of the slot no
# longer counts (newest_turns), so it is left as it is.
_LET_GO_SQL = """
UPDATE runtime_turn u SET released_at = clock_timestamp()
  FROM unnest(%(keys)s::text[]) k(key)
  CROSS JOIN LATERAL (
      SELECT n.id FROM runtime_turn n WHERE n.slot = k.key ORDER BY n.started_at DESC LIMIT 1
  ) newest
 WHERE u.id = newest.id AND u.released_at IS NULL
"""


def let_go(keys: list[str]) -> None:
    """These slots run nothing any more: their process returned from the
    callable without a finish of its own, or it is gone."""
    if not keys:
        return
    with connection.cursor() as cur:
        cur.execute(_LET_GO_SQL, {"keys": sorted(set(keys))})


_NEWEST_SQL = """
SELECT newest.id FROM unnest(%(keys)s::text[]) k(key)
CROSS JOIN LATERAL (
    SELECT n.id FROM runtime_turn n WHERE n.slot = k.key ORDER BY n.started_at DESC LIMIT 1
) newest
"""


def newest_turns(keys: list[str]) -> dict[str, Turn]:
    """Slot name → the newest turn started in it (with its ticket and
    endpoint), for the slots that ever ran one: one index probe each
    (turn_slot_idx). The slot runs it while its ``released_at`` is null."""
    if not keys:
        return {}
    with connection.cursor() as cur:
        cur.execute(_NEWEST_SQL, {"keys": sorted(set(keys))})
        ids = [row[0] for row in cur.fetchall()]
    if not ids:
        return {}
    turns = Turn.objects.select_related("ticket", "endpoint").filter(id__in=ids)
    return {turn.slot: turn for turn in turns}


def runs(key: str, turn_id: uuid.UUID | str) -> bool:
    """Whether slot ``key`` still runs ``turn_id`` (its newest turn, not let go)."""
    turn = newest_turns([key]).get(key)
    return turn is not None and turn.released_at is None and str(turn.id) == str(turn_id)


def slot_of(turn_id: uuid.UUID | str) -> str | None:
    """The slot that still runs ``turn_id``, if one does."""
    key = (
        Turn.objects.filter(id=turn_id, released_at__isnull=True, slot__isnull=False)
        .values_list("slot", flat=True)
        .first()
    )
    return key if key is not None and runs(key, turn_id) else None
