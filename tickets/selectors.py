"""Reads of the ledger shared by the API, the console and delivery."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from core.errors import Invalid, NotFound
from core.times import iso
from endpoints.models import Endpoint
from endpoints.selectors import owned_endpoint_ids

from . import search
from .models import CallbackState, DeliveryState, LedgerEvent, Ticket, TicketEvent, TicketState
from .rules import Visible

MAX_PAGE = 200


# --- Who may see a ticket ---------------------------------------------------------------------


def visible_tickets(user) -> QuerySet[Ticket]:
    """The tickets ``user`` may see (API.md "Who may see and do what"): the
    ones they submitted and those of the endpoints they own; staff see all.

    Every list, count, trace and lookup on behalf of a user starts from this
    queryset, so the filter runs in the database and lists stay
    keyset-paginated. The rule is the database's, in one function
    (``claimcheck_ticket_visible``, which admission's statement calls too),
    inlined into this filter: a caller who owns nothing reads ``submitted_by
    = me``, the prefix of ticket_submitter_id_idx (one ordered index scan);
    an owner's filter adds ``endpoint_id = ANY (owned)``, which the
    (endpoint, -id) index serves; staff's is no filter.
    """
    if user is None or not user.is_authenticated:
        return Ticket.objects.none()
    return Ticket.objects.filter(Visible(user.id, owned_endpoint_ids(user)))


def search_scopes(user, endpoint_id: int | None = None) -> list[str] | None:
    """What a search inside input and result looks among (tickets.search
    ``within``): the scopes of the scoped index that hold every ticket
    ``visible_tickets`` lets the caller see. An endpoint the list is
    filtered by, if the caller sees all of its tickets (staff, an owner);
    else the caller's own tickets and their endpoints'. None for staff
    without an endpoint: every ticket. Only an index's bound, not the rule:
    the list's own filter (``visible_tickets``) still decides."""
    if user is None or not user.is_authenticated:
        return []
    owned = owned_endpoint_ids(user)
    if endpoint_id is not None and (owned is None or endpoint_id in owned):
        return [search.endpoint_scope(endpoint_id)]
    if owned is None:
        return None
    mine = [search.submitter_scope(user.id)]
    if endpoint_id is not None:  # another's endpoint: the caller's own tickets there
        return mine
    return mine + [search.endpoint_scope(e) for e in owned]


def may_see(user, ticket: Ticket) -> bool:
    """Whether ``user`` may see this loaded ticket: ``visible_tickets``
    asked about it (the rule has one home, in the database)."""
    return visible_tickets(user).filter(id=ticket.id).exists()


def get_visible_ticket(ticket_id: uuid.UUID | str, *, user) -> Ticket:
    """The ticket, if ``user`` may see it; otherwise ``NotFound``, exactly as
    for an id that does not exist (existence must not leak)."""
    try:
        ticket_id = uuid.UUID(str(ticket_id))
    except ValueError:
        raise NotFound(f"ticket {ticket_id} not found") from None
    ticket = (
        visible_tickets(user)
        .select_related("endpoint", "turn", "return_to")
        .filter(id=ticket_id)
        .first()
    )
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


def get_ticket(ticket_id: uuid.UUID | str) -> Ticket:
    """Any ticket, for code that acts for the system (not for a caller):
    callers' reads go through ``get_visible_ticket``."""
    try:
        ticket_id = uuid.UUID(str(ticket_id))
    except ValueError:
        raise NotFound(f"ticket {ticket_id} not found") from None
    ticket = (
        Ticket.objects.select_related("endpoint", "turn", "return_to").filter(id=ticket_id).first()
    )
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


def ticket_payload(ticket: Ticket, *, duplicate: bool = False) -> dict[str, Any]:
    turn = ticket.turn if ticket.turn_id else None
    callback_ticket = None
    if ticket.callback_state not in (CallbackState.NONE, CallbackState.PENDING):
        callback_ticket = (
            Ticket.objects.filter(callback_for_id=ticket.id).values_list("id", flat=True).first()
        )
    # Only a failed, cancelled or orphaned ticket can have been retried.
    retry = None
    if ticket.state in (TicketState.FAILED, TicketState.CANCELLED, TicketState.ORPHANED):
        retry = Ticket.objects.filter(retry_of_id=ticket.id).values_list("id", flat=True).first()
    attempts = 0
    if ticket.delivery_state != DeliveryState.NONE:
        from .models import Delivery

        attempts = (
            Delivery.objects.filter(ticket_id=ticket.id).values_list("attempts", flat=True).first()
            or 0
        )
    return {
        "id": str(ticket.id),
        "endpoint": ticket.endpoint.address,
        "dedupe_key": ticket.dedupe_key,
        "state": ticket.state,
        "parent": str(ticket.parent_id) if ticket.parent_id else None,
        "trace_id": ticket.trace_id,
        "depth": ticket.depth,
        "input": ticket.input,
        "result": ticket.result,
        "error": ticket.error,
        "artifacts": ticket.artifacts or [],
        "turn": {"id": str(turn.id), "seq": turn.seq, "state": turn.state} if turn else None,
        "completed_by_turn": str(ticket.completed_by_turn_id)
        if ticket.completed_by_turn_id
        else None,
        "rerun_of": str(ticket.rerun_of_id) if ticket.rerun_of_id else None,
        "retry_of": str(ticket.retry_of_id) if ticket.retry_of_id else None,
        "retry": str(retry) if retry else None,
        "budget_s": ticket.budget_s,
        "return_to": (
            {"endpoint": ticket.return_to.address, "continuation": ticket.continuation}
            if ticket.return_to_id
            else None
        ),
        "requester": ticket.requester or {},
        "callback": {
            "state": ticket.callback_state,
            "ticket": str(callback_ticket) if callback_ticket else None,
        },
        "delivery": {"state": ticket.delivery_state, "attempts": attempts},
        "obligation": {
            "state": ticket.obligation_state,
            "next_update_at": iso(ticket.obligation_due_at),
            "overdue": ticket.obligation_overdue,
            "note": ticket.obligation_note,
        },
        "created_at": iso(ticket.created_at),
        "updated_at": iso(ticket.updated_at),
        "finished_at": iso(ticket.finished_at),
        "duplicate": duplicate,
    }


def encode_cursor(ticket_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(ticket_id.bytes).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return uuid.UUID(bytes=raw)
    except (ValueError, TypeError):
        raise Invalid("cursor is not one this API returned") from None


def _listed(
    user,
    *,
    endpoint_id: int | None,
    state: str | None,
    limit: int,
    since=None,
    until=None,
) -> QuerySet[Ticket]:
    """What the API's list and the console's search share: the page size
    checked, the tickets ``user`` may see, by endpoint, state and time (an
    id range: ids are UUIDv7)."""

    if not 1 <= limit <= MAX_PAGE:
        raise Invalid(f"limit must be between 1 and {MAX_PAGE}")
    qs: QuerySet[Ticket] = visible_tickets(user).select_related("endpoint", "turn", "return_to")
    if endpoint_id is not None:
        qs = qs.filter(endpoint_id=endpoint_id)
    if state:
        if state not in TicketState.values:
            raise Invalid(f"state must be one of {', '.join(TicketState.values)}")
        qs = qs.filter(state=state)
    if since is not None:
        qs = qs.filter(id__gte=_uuid7_floor(since))
    if until is not None:
        qs = qs.filter(id__lt=_uuid7_floor(until))
    return qs


def _newest(
    qs: QuerySet[Ticket],
    terms: list[search.Term] | None,
    n: int,
    scopes: list[str] | None = None,
) -> list[Ticket]:
    """The ``n`` newest tickets of ``qs``; with search terms, the newest
    that match them among ``scopes`` (``search_scopes``;
    tickets.search.newest_matching says how)."""
    if not terms:
        return list(qs.order_by("-id")[:n])
    ids = search.newest_matching(qs, terms, n, scopes)
    return list(qs.filter(id__in=ids).order_by("-id")) if ids else []


def list_tickets(
    *,
    user,
    endpoint_id: int | None = None,
    state: str | None = None,
    trace_id: str | None = None,
    since=None,
    until=None,
    search_text: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Ticket], str | None]:
    """The tickets ``user`` may see, newest first, keyset-paginated on the
    time-ordered id (no OFFSET, no COUNT). ``search_text`` is terms only
    (tickets.search): 400 ``invalid_search`` for anything else."""
    terms = search.parse_terms(search_text) if search_text else None
    qs = _listed(user, endpoint_id=endpoint_id, state=state, limit=limit, since=since, until=until)
    if trace_id:
        qs = qs.filter(trace_id=trace_id)
    if cursor:
        qs = qs.filter(id__lt=decode_cursor(cursor))
    scopes = search_scopes(user, endpoint_id) if terms else None
    rows = _newest(qs, terms, limit + 1, scopes)
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor


def event_payload(event: LedgerEvent) -> dict[str, Any]:
    return {
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "actor": event.actor,
        "turn": str(event.turn_id) if event.turn_id else None,
        "detail": event.detail,
        "at": iso(event.at),
    }


def ticket_events(ticket_id: uuid.UUID) -> list[LedgerEvent]:
    """The ticket's events oldest first, its admission event first whether
    the ticket row implies it or it is a row (LedgerEvent)."""
    return list(LedgerEvent.objects.filter(ticket_id=ticket_id).order_by("id"))


def lineage(ticket: Ticket, *, user) -> dict[str, Any]:
    """The trace's tickets that ``user`` may see (a trace shows only those);
    ``root`` is the trace's root if it is one of them, else None."""
    nodes = list(
        visible_tickets(user)
        .filter(trace_id=ticket.trace_id)
        .select_related("endpoint")
        .order_by("id")
        .only("id", "parent_id", "retry_of_id", "endpoint__address", "state", "depth", "trace_id")
    )
    roots = [n for n in nodes if n.parent_id is None]
    return {
        "trace_id": ticket.trace_id,
        "root": str(roots[0].id) if roots else None,
        "nodes": [
            {
                "id": str(n.id),
                "parent": str(n.parent_id) if n.parent_id else None,
                "endpoint": n.endpoint.address,
                "state": n.state,
                "depth": n.depth,
                "retry_of": str(n.retry_of_id) if n.retry_of_id else None,
            }
            for n in nodes
        ],
    }


# --- Search (the console's one box) ---------------------------------------------------------------

_HEX = frozenset("0123456789abcdef")


def _uuid7_floor(moment) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond: ids are time-ordered
    (``core.ids.new_id``), so a time range is an id range on the primary key.
    A moment before 1970 is the smallest id (a UUIDv7 holds no earlier one)."""
    return uuid.UUID(int=max(0, int(moment.timestamp() * 1000)) << 80)


def id_fragment(text: str) -> str | None:
    """``text`` as a piece of a ticket id (lower-case hex, dashes kept where
    typed), or None if it cannot be one. The pages show the id's last eight
    characters after an ellipsis (``…36ada1f2``): the ellipsis is dropped."""
    text = text.strip().strip("…").strip(".").lower()
    if len(text) < 4 or not set(text) <= _HEX | {"-"}:
        return None
    return text


def find_tickets(
    *,
    user,
    q: str = "",
    endpoint_id: int | None = None,
    state: str | None = None,
    delivery_state: str | None = None,
    since=None,
    until=None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Ticket], str | None]:
    """``list_tickets`` with the console's search box and filters: ``q`` finds
    a ticket by full or partial id (a head or a tail, as the pages print it),
    dedupe key or trace id. Each way of matching is its own index-served
    query (the primary key, the id-tail index, ``(endpoint, dedupe_key)``,
    ``(trace_id, id)``), each cut at ``limit + 1``, merged newest first: no
    OR across indexes for the planner to turn into a scan, no COUNT.
    ``since``/``until`` (aware datetimes) are an id range: ids are UUIDv7.
    Search terms in ``q`` (``input.customer:42``, tickets.search) narrow
    every one of those ways, and alone list what they match."""
    terms, q = search.split_query(q)
    base = _listed(
        user, endpoint_id=endpoint_id, state=state, limit=limit, since=since, until=until
    )
    if delivery_state:
        if delivery_state not in DeliveryState.values:
            raise Invalid(f"delivery must be one of {', '.join(DeliveryState.values)}")
        base = base.filter(delivery_state=delivery_state)
    if cursor:
        base = base.filter(id__lt=decode_cursor(cursor))
    if not q:
        branches = [base]
    else:
        branches = [base.filter(trace_id=q)]
        # Every endpoint's id.
        endpoint_ids = list(Endpoint.objects.values_list("id", flat=True))
        # The unique (endpoint, dedupe_key) index serves "endpoint IN (all) AND key = q".
        branches.append(base.filter(endpoint_id__in=endpoint_ids, dedupe_key=q))
        fragment = id_fragment(q)
        if fragment is not None:
            try:
                branches.append(base.filter(id=uuid.UUID(fragment)))
            except ValueError:
                bare = fragment.replace("-", "")
                if bare and len(bare) < 32:
                    # A head: the id range it opens (the primary key).
                    low = uuid.UUID(bare.ljust(32, "0"))
                    high = uuid.UUID(bare.ljust(32, "f"))
                    branches.append(base.filter(id__gte=low, id__lte=high))
                # A tail, typed with its dashes or without: ticket_id_tail_idx
                # holds the reversed last group (12
                # characters); the whole tail is checked on what it finds.
                liat = (fragment if "-" in fragment else _dashed_tail(fragment))[::-1]
                branches.append(
                    base.extra(  # noqa: S610 - parameters, not SQL text
                        where=[
                            "reverse(right(tickets_ticket.id::text, 12)) LIKE %s",
                            "reverse(tickets_ticket.id::text) LIKE %s",
                        ],
                        params=[liat[:12] + "%", liat + "%"],
                    )
                )
    scopes = search_scopes(user, endpoint_id) if terms else None
    found: dict[uuid.UUID, Ticket] = {}
    for branch in branches:
        if terms and branch is not base:
            # An id, trace or dedupe key finds a few tickets by its own
            # index: the terms only check those.
            branch = branch.filter(search.matching(terms))
            for ticket in branch.order_by("-id")[: limit + 1]:
                found[ticket.id] = ticket
        else:
            for ticket in _newest(branch, terms, limit + 1, scopes):
                found[ticket.id] = ticket
    rows = sorted(found.values(), key=lambda t: t.id, reverse=True)[: limit + 1]
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor


def _dashed_tail(bare: str) -> str:
    """A tail typed without dashes, with the dashes of the canonical form
    (8-4-4-4-12) put back, so it matches ``id::text``."""
    groups = [8, 4, 4, 4, 12]
    out, remaining = [], bare
    for size in reversed(groups):
        if not remaining:
            break
        out.append(remaining[-size:])
        remaining = remaining[:-size]
    return "-".join(reversed(out))


def awaiting_approval(*, user, limit: int = 20) -> tuple[list[Ticket], bool]:
    """The newest tickets the user may see whose delivery waits for an
    owner's approval, and whether there are more than ``limit``
    (ticket_delivery_idx serves it)."""
    rows = list(
        visible_tickets(user)
        .filter(delivery_state=DeliveryState.AWAITING_APPROVAL)
        .select_related("endpoint", "turn", "return_to")
        .order_by("-id")[: limit + 1]
    )
    return rows[:limit], len(rows) > limit


def change_token(ticket_id: uuid.UUID | str) -> str:
    """What a page showing the ticket last saw: its newest event, which every
    change of the ticket or its record appends in the change's transaction
    (console live regions). One indexed read; "" for a ticket that is not
    there (a ticket has its admission event from the start)."""
    newest = (
        LedgerEvent.objects.filter(ticket_id=ticket_id)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return "" if newest is None else str(newest)


# The newest tickets whose admission events ledger_change_token reads: more
# than are admitted between one ticket's id (taken before its admission)
# and its commit.
ADMISSION_TAIL = 32
# One statement, both backward steps (GREATEST passes over a NULL).
_LEDGER_TOKEN = f"""
SELECT COALESCE(GREATEST(
    (SELECT id FROM {TicketEvent._meta.db_table} ORDER BY id DESC LIMIT 1),
    (SELECT max(t.admission_event) FROM (
        SELECT admission_event FROM {Ticket._meta.db_table} ORDER BY id DESC LIMIT %s) t)
), 0)
"""


def ledger_change_token() -> str:
    """The newest event of the whole ledger: what a list or the dashboard
    last saw. It moves with any ticket's change; a page re-reads what its
    user may see. Backward steps of two primary keys: the newest event row,
    and the admission events of the newest tickets (an admission writes no
    event row: tickets.models.LedgerEvent; ticket ids are time-ordered, so a
    ticket may commit after a newer one, hence a tail of them). As before,
    an event committed after a higher id moves it only with the next change."""
    with connection.cursor() as cur:
        cur.execute(_LEDGER_TOKEN, [ADMISSION_TAIL])
        return str(cur.fetchone()[0])
