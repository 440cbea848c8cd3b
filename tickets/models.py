"""The ledger: tickets, their events, traces, callbacks and deliveries;
the turns that run them, the endpoint's exclusive lock and its history.

Writes live in ``tickets/admission.py`` (new tickets),
``tickets/lifecycle.py`` (every later transition of a ticket) and the
transition functions of ``tickets/sql/`` with their callers (a turn's start
and finish, the lock's release). Nothing else sets a state field.

The turn, lock and history tables keep the names they had when the runtime
owned them (``runtime_turn``, ``runtime_endpointlock``,
``runtime_contextentry``): the ledger took them over without moving data.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from core import limits
from core.ids import new_id
from endpoints.models import Endpoint, RunnerKind


class TicketState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECOVERING = "recovering"
    ORPHANED = "orphaned"


TERMINAL_STATES = frozenset(
    {TicketState.SUCCEEDED, TicketState.FAILED, TicketState.CANCELLED, TicketState.ORPHANED}
)

# The terminal states as the search indexes' predicates name them (a list,
# in a fixed order: a migration's text).
SETTLED_STATES = ["cancelled", "failed", "orphaned", "succeeded"]
assert set(SETTLED_STATES) == TERMINAL_STATES

# The allowed edges of the ticket state machine (DESIGN.md). A running ticket
# whose cancel was requested becomes cancelled when its turn is proven stopped.
TICKET_EDGES: dict[str, frozenset[str]] = {
    TicketState.QUEUED: frozenset({TicketState.RUNNING, TicketState.CANCELLED}),
    TicketState.RUNNING: frozenset(
        {
            TicketState.SUCCEEDED,
            TicketState.FAILED,
            TicketState.WAITING,
            TicketState.RECOVERING,
            TicketState.CANCELLED,
        }
    ),
    TicketState.WAITING: frozenset(
        {TicketState.SUCCEEDED, TicketState.FAILED, TicketState.CANCELLED}
    ),
    TicketState.RECOVERING: frozenset({TicketState.ORPHANED, TicketState.FAILED}),
    TicketState.SUCCEEDED: frozenset(),
    TicketState.FAILED: frozenset(),
    TicketState.CANCELLED: frozenset(),
    TicketState.ORPHANED: frozenset(),
}


class CallbackState(models.TextChoices):
    NONE = "none"
    PENDING = "pending"
    ACCEPTED = "accepted"
    RECORDED = "recorded"


class DeliveryState(models.TextChoices):
    NONE = "none"
    AWAITING_APPROVAL = "awaiting_approval"
    PENDING = "pending"
    ATTEMPTED = "attempted"
    DELIVERED = "delivered"
    FAILED = "failed"


class ObligationState(models.TextChoices):
    NONE = "none"  # not a root ticket: its parent carries the obligation
    OPEN = "open"
    CLOSED = "closed"


class Ticket(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No single-column index: the composite indexes below all lead with it.
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", on_delete=models.PROTECT, related_name="tickets", db_index=False
    )
    # Null when the caller gave none: NULLs never conflict, so every such
    # admission is a new ticket.
    dedupe_key = models.CharField(max_length=limits.DEDUPE_KEY_CHARS, null=True, blank=True)
    input_sha256 = models.CharField(max_length=64)
    input = models.JSONField()
    # The rarely-set references below have partial indexes (Meta.indexes):
    # an index of every ticket would hold a NULL entry for nearly all of them.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="children",
        db_index=False,
    )
    trace_id = models.CharField(max_length=limits.TRACE_ID_CHARS)
    depth = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=TicketState.choices, default=TicketState.QUEUED)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    artifacts = models.JSONField(default=list, blank=True)
    # The exact turn registered for this ticket: the only one that may answer it.
    # Indexed only once set (ticket_turn_idx, Meta): a queued ticket costs no entry.
    turn = models.ForeignKey(
        "Turn",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    # A waiting ticket completed by a callback's turn is attributed to that turn.
    completed_by_turn = models.ForeignKey(
        "Turn",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    return_to = models.ForeignKey(
        "endpoints.Endpoint",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    continuation = models.JSONField(null=True, blank=True)
    # For a re-run authorised by a recovery decision: the ticket it replaces.
    # The re-run carries the requester's obligation and delivery.
    rerun_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="reruns",
        db_index=False,
    )
    # For a retry (tickets/retry.py): the failed, cancelled or orphaned ticket
    # it retries. One retry per ticket (a second retry retries the retry), so
    # a repeated click converges on the first instead of admitting twice.
    # The partial unique constraint ticket_retry_of_unique (Meta) holds it
    # and indexes only the tickets that are retries.
    retry_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="retries",
        db_index=False,
    )
    # A per-ticket turn budget in seconds, at most the endpoint's (a retry
    # may ask for less): the turn's deadline is the smaller of the two.
    budget_s = models.PositiveIntegerField(null=True, blank=True)
    # For a callback ticket: the ticket whose completion it reports. At most
    # one per ticket: the partial unique constraint ticket_callback_for_unique
    # (Meta), which indexes only the callback tickets (a one-to-one field's
    # unique index would hold a NULL entry for every other ticket, in every
    # version).
    callback_for = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    requester = models.JSONField(default=dict, blank=True)
    # Who may see the ticket (with the endpoint's owners and staff). No
    # single-column index: ticket_submitter_id_idx leads with it, and holds
    # only the tickets that have one (the runtime's own admissions have none).
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    callback_state = models.CharField(
        max_length=16, choices=CallbackState.choices, default=CallbackState.NONE
    )
    delivery_state = models.CharField(
        max_length=20, choices=DeliveryState.choices, default=DeliveryState.NONE
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # A queued ticket with no dispatch message in flight: its message found
    # the endpoint's lock held (or started an older ticket), or admission saw
    # the lock held and published nothing. The endpoint's next release
    # publishes it: one broker message per turn, no ticket left behind.
    needs_dispatch = models.BooleanField(default=False, db_default=False)
    obligation_state = models.CharField(
        max_length=8, choices=ObligationState.choices, default=ObligationState.NONE
    )
    obligation_due_at = models.DateTimeField(null=True, blank=True)
    obligation_overdue = models.BooleanField(default=False)
    obligation_note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # The admission event this row implies (LedgerEvent; docs/explanation/scale.md,
    # "What an admission writes"): its id, taken from the events' sequence
    # at admission, and its actor. Its other fields are the row's own
    # (``'' -> queued``, ``at`` = created_at, ``detail.parent``). Null for a
    # ticket whose admission event is a row of TicketEvent. Written once:
    # the database refuses a change of either (migration
    # 0011_implied_admission_event).
    admission_event = models.BigIntegerField(null=True, blank=True)
    admission_actor = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "dedupe_key"], name="ticket_endpoint_dedupe_unique"
            ),
            models.CheckConstraint(
                condition=Q(state__in=TicketState.values), name="ticket_state_valid"
            ),
            # The database functions write these as literals: the database
            # holds each column to its enum (tests/test_house_rules.py).
            models.CheckConstraint(
                condition=Q(callback_state__in=CallbackState.values),
                name="ticket_callback_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(delivery_state__in=DeliveryState.values),
                name="ticket_delivery_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(obligation_state__in=ObligationState.values),
                name="ticket_obligation_state_valid",
            ),
            models.UniqueConstraint(
                fields=["retry_of"],
                name="ticket_retry_of_unique",
                condition=Q(retry_of__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(budget_s__isnull=True) | Q(budget_s__gte=1),
                name="ticket_budget_s_positive",
            ),
            models.UniqueConstraint(
                fields=["callback_for"],
                name="ticket_callback_for_unique",
                condition=Q(callback_for__isnull=False),
            ),
        ]
        indexes = [
            # Keyset pagination, newest first (ids are time-ordered).
            models.Index(fields=["endpoint", "-id"], name="ticket_endpoint_id_idx"),
            # Every state but the one most tickets end in: a page of succeeded
            # tickets walks the primary key newest first (nearly every row
            # matches), and the index costs an entry only for the others
            # (fewer bytes per ticket). Nor
            # queued ones: those are ticket_queued_idx's, by endpoint, and
            # with queued tickets here a turn's generic plan could walk
            # every endpoint's queue for its own next ticket.
            models.Index(
                fields=["state", "-id"],
                name="ticket_state_id_idx",
                condition=~Q(state__in=["succeeded", "queued"]),
            ),
            # A trace's tickets (at most TRACE_HARD_LIMIT) are sorted by id
            # after the lookup: the id made every entry 16 bytes longer.
            models.Index(fields=["trace_id"], name="ticket_trace_idx"),
            # A submitter's own tickets, newest first: the visibility filter of
            # a caller who owns no endpoint is this index's prefix, so their
            # ticket list stays one ordered index scan (tickets.selectors).
            # Partial: a ticket the runtime admitted (a child, a callback, a
            # re-run) has no submitter and costs no entry.
            models.Index(
                fields=["submitted_by", "-id"],
                name="ticket_submitter_id_idx",
                condition=Q(submitted_by__isnull=False),
            ),
            # Dispatch: the oldest queued ticket of an endpoint, and the
            # lost-dispatch sweep. Partial: only queued rows are indexed.
            models.Index(
                fields=["endpoint", "id"],
                name="ticket_queued_idx",
                condition=Q(state="queued"),
            ),
            models.Index(
                fields=["obligation_due_at"],
                name="ticket_obligation_open_idx",
                condition=Q(obligation_state="open"),
            ),
            # The overdue sweep's: open and not yet flagged (a result nobody
            # pulled stays open, flagged, for good: tickets.obligations).
            models.Index(
                fields=["obligation_due_at"],
                name="ticket_obligation_due_idx",
                condition=Q(obligation_state="open", obligation_overdue=False),
            ),
            # The callbacks a target refused earlier, for their retry sweep
            # (tickets.callbacks): a handful of rows, whatever the ledger.
            models.Index(
                fields=["id"],
                name="ticket_callback_pending_idx",
                condition=Q(callback_state="pending"),
            ),
            # Search inside input and result (tickets.search): ``column @>
            # document``. jsonb_path_ops holds one hash per path to a value,
            # not every key and value apart: smaller, and it serves exactly
            # containment. Settled tickets only: every version of a row
            # enters each index whose predicate it meets, so the admission
            # and a turn's start write no entry here; the tickets still in
            # flight, few whatever the ledger's size, are checked row by row
            # (tickets.search.newest_matching). A ticket with no result: no
            # entry in the second.
            GinIndex(
                fields=["input"],
                opclasses=["jsonb_path_ops"],
                name="ticket_input_search_idx",
                condition=Q(state__in=SETTLED_STATES),
            ),
            GinIndex(
                fields=["result"],
                opclasses=["jsonb_path_ops"],
                name="ticket_result_search_idx",
                condition=Q(result__isnull=False, state__in=SETTLED_STATES),
            ),
            # The same paths under the ticket's submitter and its endpoint,
            # ticket_search_scoped_idx, is built in SQL in the initial
            # migration (an expression with an operator class).
            # The references a ticket may not have: only the tickets that
            # have one (a queued ticket has no turn yet). A lookup by value
            # (``turn_id = %s``, a foreign key's check) implies NOT NULL, so
            # the partial index serves it.
            *[
                models.Index(
                    fields=[field],
                    name=f"ticket_{field}_idx",
                    condition=Q(**{f"{field}__isnull": False}),
                )
                for field in (
                    "turn",
                    "parent",
                    "rerun_of",
                    "return_to",
                    "completed_by_turn",
                    "approved_by",
                )
            ],
        ]

    def __str__(self) -> str:
        return f"ticket {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


# The events that say what a waiting ticket waits on, the last one counting:
# the wait of its turn (``waiting_for_children``, a transition), and each
# further round a resumed agent starts while it stays waiting
# (``waiting_again``, no transition). Both carry ``children`` and ``continuation``.
WAIT_EVENT_KINDS = ("waiting_for_children", "waiting_again")


class TicketEvent(models.Model):
    """Append-only: the database refuses UPDATE and DELETE (see migrations)."""

    # One index entry per event, deduplicated into one posting list per
    # ticket; a ticket's handful of events are sorted by id after the lookup.
    ticket = models.ForeignKey(Ticket, on_delete=models.DO_NOTHING, related_name="events")
    kind = models.CharField(max_length=64)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    # Informational: the statement that writes the event holds the turn. No
    # foreign key (a check on every turn event) and no index (nothing looks
    # events up by turn).
    turn = models.ForeignKey(
        "Turn",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state}"


class LedgerEvent(models.Model):
    """Every event of a ticket, as its readers see it (the view
    ``tickets_ticketevent_all``, migration 0011_implied_admission_event):
    the rows of TicketEvent and the admission event a ticket row implies
    (``Ticket.admission_event``).
    The events API, the stream, the console's timeline and change tokens
    and ``audit_ledger`` read this; writers append TicketEvent rows.

    Filter by ``ticket``: the view's two halves are then the ticket's
    posting list in the events' ticket index and the ticket's primary key.
    An id alone finds an event row through its key, but an implied one only
    by a scan of the tickets."""

    id = models.BigIntegerField(primary_key=True)
    ticket = models.ForeignKey(
        Ticket, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    kind = models.CharField(max_length=64)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    turn = models.ForeignKey(
        "Turn",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
    )
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "tickets_ticketevent_all"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state}"


class Trace(models.Model):
    """Counts the tickets of a trace for the circuit breaker: all of them
    (``tickets``), and per party (``parties``: ``{submitter id or "-": n}``),
    which the hard limit applies to (tickets/sql/claimcheck_admit_breaker.sql)."""

    id = models.CharField(max_length=64, primary_key=True)
    tickets = models.PositiveIntegerField(default=0)
    parties = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    max_depth = models.PositiveIntegerField(default=0)
    flagged = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    # The budget its root's submitter set (``{tokens?, cost?, wall_s?}``;
    # None: none), what its agent turns spent so far, and when it crossed
    # the soft and the hard limit (tickets/budgets.py). Set once the hard
    # one is crossed, ``exhausted_at`` refuses every admission in the trace
    # (tickets/sql/claimcheck_admit_breaker.sql). Constant defaults: no rewrite.
    budget = models.JSONField(null=True, blank=True)
    spent_tokens = models.BigIntegerField(default=0, db_default=0)
    spent_cost = models.DecimalField(max_digits=20, decimal_places=6, default=0, db_default=0)
    budget_warned_at = models.DateTimeField(null=True, blank=True)
    exhausted_at = models.DateTimeField(null=True, blank=True)
    exhausted_reason = models.CharField(max_length=16, blank=True, default="", db_default="")

    class Meta:
        indexes = [
            # The wall-clock sweep reads only budgeted traces still open.
            models.Index(
                fields=["created_at"],
                name="trace_budget_open",
                condition=models.Q(budget__isnull=False, exhausted_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return self.id


class Callback(models.Model):
    """One per source ticket: the unique constraint makes repeated or
    concurrent completion notices converge on the same callback ticket."""

    source = models.OneToOneField(Ticket, on_delete=models.PROTECT, related_name="callback")
    target = models.ForeignKey("endpoints.Endpoint", on_delete=models.PROTECT, related_name="+")
    ticket = models.OneToOneField(
        Ticket, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"callback for {self.source_id}"


class Delivery(models.Model):
    """One per root ticket; its id is the stable ``webhook-id``."""

    class Mode(models.TextChoices):
        WEBHOOK = "webhook"
        PULL = "pull"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    ticket = models.OneToOneField(Ticket, on_delete=models.PROTECT, related_name="delivery")
    mode = models.CharField(max_length=8, choices=Mode.choices)
    url = models.URLField(max_length=limits.URL_CHARS, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            models.CheckConstraint(
                condition=Q(mode__in=["webhook", "pull"]), name="delivery_mode_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_due_idx",
                condition=Q(next_attempt_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.mode} delivery of {self.ticket_id}"


class DeliveryAttempt(models.Model):
    # No index of its own: attempt_number_unique (delivery, number) leads with it.
    delivery = models.ForeignKey(
        Delivery, on_delete=models.PROTECT, related_name="attempt_log", db_index=False
    )
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    status_code = models.IntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["delivery_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="attempt_number_unique")
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"


from .schedule_models import Schedule, ScheduleSlot  # noqa: E402, F401  (Django finds models here)


class EndpointLock(models.Model):
    """One row per endpoint. Taken FOR UPDATE from turn start through exact
    completion or failure isolation; ``holder`` is the one turn allowed to
    change the endpoint's context, ``token`` its fencing ``seq``."""

    endpoint = models.OneToOneField(
        Endpoint, primary_key=True, on_delete=models.CASCADE, related_name="lock"
    )
    holder = models.OneToOneField(
        "Turn", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    token = models.BigIntegerField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The runtime's table name from before the ledger owned the lock:
        # the move changed no table (docs/explanation/architecture.md).
        db_table = "runtime_endpointlock"
        constraints = [
            # Holder and token are set and cleared together.
            models.CheckConstraint(
                condition=(Q(holder__isnull=True) & Q(token__isnull=True))
                | (Q(holder__isnull=False) & Q(token__isnull=False)),
                name="lock_holder_token_together",
            ),
        ]

    def __str__(self) -> str:
        return f"lock of {self.endpoint_id} held by {self.holder_id or 'nobody'}"


class TurnState(models.TextChoices):
    # running -> completed | failed | interrupting -> stopped | uncertain
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTING = "interrupting"
    STOPPED = "stopped"
    UNCERTAIN = "uncertain"
    # An uncertain turn closed by an owner decision without stop evidence.
    UNRESOLVED = "unresolved"


TURN_ACTIVE_STATES = (TurnState.RUNNING, TurnState.INTERRUPTING)


class Turn(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: turn_seq_unique (endpoint, seq) leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.PROTECT, related_name="turns", db_index=False
    )
    ticket = models.ForeignKey("Ticket", on_delete=models.PROTECT, related_name="turns")
    seq = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=TurnState.choices, default=TurnState.RUNNING)
    runner_kind = models.CharField(max_length=16, choices=RunnerKind.choices)
    celery_task_id = models.CharField(max_length=255, blank=True, default="")
    worker = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    interrupt_requested_at = models.DateTimeField(null=True, blank=True)
    interrupt_reason = models.CharField(max_length=32, blank=True, default="")
    ended_at = models.DateTimeField(null=True, blank=True)
    # What proves it ended: {kind, observed_at, detail}.
    stop_evidence = models.JSONField(null=True, blank=True)
    # SHA-256 of the credential handed to this turn's runner in its envelope:
    # the only credential the turn API accepts for this turn. The token itself
    # is never stored; empty (turns from before tokens) matches nothing.
    token_sha256 = models.CharField(max_length=64, blank=True, default="", db_default="")
    # The endpoint generation it ran under (its start wrote the endpoint's
    # current one): a change approved while it runs does not touch it.
    generation = models.PositiveIntegerField(default=1, db_default=1)
    # The worker pool process that runs the turn's callable, "<node>:<pid>"
    # (tickets/turns/slots.py), written by the start; null for a turn
    # started outside a worker. With ``released_at`` it is the worker
    # registry's "which process runs which turn" (runtime/selectors.py): a
    # process runs the newest turn started in it until it lets go of it.
    slot = models.CharField(max_length=300, null=True, blank=True)
    # When that process let go of the turn: its own finish (the same
    # statement), or the runtime once the callable returned without one (a
    # deferred turn, a stale outcome, a quarantine). Null while the callable
    # may still occupy the process, whatever the turn's state.
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "runtime_turn"
        ordering = ["endpoint_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "seq"], name="turn_seq_unique"),
            models.CheckConstraint(
                condition=Q(state__in=TurnState.values), name="turn_state_valid"
            ),
        ]
        indexes = [
            # The budget sweeps scan only active turns: their cost follows the
            # number of running turns, not the size of the ledger.
            models.Index(
                fields=["deadline_at"],
                name="turn_active_deadline_idx",
                condition=Q(state__in=["running", "interrupting"]),
            ),
            # A slot's newest turn, one index probe per pool process (the
            # registry's views, a stop's check before its kill).
            models.Index(
                fields=["slot", "started_at"],
                name="turn_slot_idx",
                condition=Q(slot__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.id} #{self.seq}"


class ContextEntry(models.Model):
    """The endpoint's history: one entry per completed turn."""

    # No index of its own: context_recent_idx (endpoint, -seq) leads with it.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="history", db_index=False
    )
    turn = models.OneToOneField(Turn, on_delete=models.PROTECT, related_name="context_entry")
    ticket = models.ForeignKey("Ticket", on_delete=models.PROTECT, related_name="+")
    seq = models.BigIntegerField()
    input = models.JSONField(null=True)
    result = models.JSONField(null=True)
    artifacts = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runtime_contextentry"
        ordering = ["endpoint_id", "seq"]
        verbose_name_plural = "context entries"
        indexes = [models.Index(fields=["endpoint", "-seq"], name="context_recent_idx")]

    def __str__(self) -> str:
        return f"context {self.endpoint_id} #{self.seq}"


class RetentionHold(models.Model):
    """A ticket retention must keep, and who asks: the prune
    (claimcheck_prune_ledger) keeps every trace with a held ticket. The
    ledger's own record of what an app above it still points at, so that
    the prune reads only the ledger's tables: recovery holds the tickets of
    its cases and the re-runs its decisions authorised (a trigger on its
    own tables: recovery/sql/claimcheck_recovery_hold.sql). Never released:
    a case's record outlives the retention window, and so do its tickets."""

    # No index of its own: retention_hold_unique (ticket, held_by) leads with it.
    ticket = models.ForeignKey(Ticket, on_delete=models.PROTECT, related_name="+", db_index=False)
    # The holder, named by its app: "recovery case <id>", "recovery decision <id>".
    held_by = models.CharField(max_length=200)
    since = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["ticket", "held_by"], name="retention_hold_unique")
        ]

    def __str__(self) -> str:
        return f"{self.ticket_id} held by {self.held_by}"
