"""View-only admin for the ledger (core/readonly_admin.py says why and how).

Searches name what the indexes serve: a ticket by id, endpoint address,
trace id or ``address:dedupe_key`` (the unique index); related rows by the
ticket or delivery id they hang off.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q

from core.readonly_admin import ReadOnlyAdmin, any_of, endpoint_q, uuid_q
from endpoints.selectors import owned_endpoint_ids, resolve_endpoint

from .models import (
    Callback,
    ContextEntry,
    Delivery,
    DeliveryAttempt,
    EndpointLock,
    Ticket,
    TicketEvent,
    Trace,
    Turn,
)
from .selectors import visible_tickets


def _visible_ids(user):
    """The ids of the tickets ``user`` may see, as a subquery (the console's rule)."""
    return visible_tickets(user).values("id")


def _resolve(address: str):
    return resolve_endpoint(address)


@admin.register(Ticket)
class TicketAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "endpoint",
        "state",
        "dedupe_key",
        "trace_id",
        "depth",
        "callback_state",
        "delivery_state",
        "created_at",
    )
    # state has its own (state, -id) index; the other small enums do not.
    list_filter = ("state",)
    list_select_related = ("endpoint",)
    list_defer = ("input", "result", "error", "artifacts", "requester", "continuation")
    # Newest first on the time-ordered primary key (no created_at index).
    ordering = ("-id",)
    search_fields = ("id", "endpoint__address", "trace_id", "dedupe_key")
    search_help_text = "A ticket id, an endpoint address, a trace id, or address:dedupe_key."
    raw_id_fields = (
        "endpoint",
        "parent",
        "turn",
        "completed_by_turn",
        "return_to",
        "rerun_of",
        "callback_for",
        "submitted_by",
        "approved_by",
    )

    def search_q(self, term: str) -> Q | None:
        address, sep, key = term.partition(":")
        # Addresses are slugs (no ':'), so the first ':' separates the key.
        keyed = endpoint_q(address, _resolve) if sep and key else None
        return any_of(
            uuid_q(term, "id"),
            endpoint_q(term, _resolve),
            Q(trace_id=term) if len(term) <= 64 else None,
            keyed & Q(dedupe_key=key) if keyed is not None else None,
        )

    def owner_scope(self, queryset, user):
        return queryset.filter(id__in=_visible_ids(user))


@admin.register(TicketEvent)
class TicketEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "ticket_id", "kind", "from_state", "to_state", "actor", "turn_id", "at")
    list_defer = ("detail",)
    ordering = ("-id",)
    search_fields = ("ticket",)
    search_help_text = "A ticket id: its events."
    raw_id_fields = ("ticket", "turn")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "ticket_id")  # (ticket, id) index

    def owner_scope(self, queryset, user):
        return queryset.filter(ticket_id__in=_visible_ids(user))


@admin.register(Trace)
class TraceAdmin(ReadOnlyAdmin):
    list_display = ("id", "tickets", "max_depth", "flagged", "created_at")
    ordering = ("-id",)  # a root ticket's time-ordered id, as hex
    search_fields = ("id",)
    search_help_text = "A trace id."

    def search_q(self, term: str) -> Q | None:
        return Q(id=term)

    def owner_scope(self, queryset, user):
        return queryset.filter(id__in=visible_tickets(user).values("trace_id"))


@admin.register(Callback)
class CallbackAdmin(ReadOnlyAdmin):
    list_display = ("id", "source_id", "target", "ticket_id", "created_at")
    list_select_related = ("target",)
    ordering = ("-id",)
    search_fields = ("source", "ticket")
    search_help_text = "The source ticket's id, or the callback ticket's id."
    raw_id_fields = ("source", "target", "ticket")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "source_id", "ticket_id")  # both unique

    def owner_scope(self, queryset, user):
        return queryset.filter(source_id__in=_visible_ids(user))


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "ticket_id",
        "mode",
        "url",
        "attempts",
        "next_attempt_at",
        "delivered_at",
        "created_at",
    )
    list_filter = ("mode",)
    ordering = ("-id",)
    search_fields = ("id", "ticket")
    search_help_text = "A delivery id (the webhook-id) or its ticket's id."
    raw_id_fields = ("ticket",)

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "id", "ticket_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(ticket_id__in=_visible_ids(user))


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "delivery_id", "number", "status_code", "latency_ms", "error", "at")
    ordering = ("-id",)
    search_fields = ("delivery",)
    search_help_text = "A delivery id: its attempts."
    raw_id_fields = ("delivery",)

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "delivery_id")  # (delivery, number) unique index

    def owner_scope(self, queryset, user):
        return queryset.filter(delivery__ticket_id__in=_visible_ids(user))


# The turns, the lock and the history: what the runtime shows of them is
# read here, where they are owned.


def _owned_endpoints(user) -> list[int]:
    """The endpoints ``user`` owns (the console's rule; staff never get here)."""
    return owned_endpoint_ids(user) or []


@admin.register(EndpointLock)
class EndpointLockAdmin(ReadOnlyAdmin):
    list_display = ("endpoint", "holder_id", "token", "acquired_at")
    list_select_related = ("endpoint",)
    ordering = ("endpoint_id",)
    search_fields = ("endpoint", "holder")
    search_help_text = "An endpoint address, or the holding turn's id."
    raw_id_fields = ("endpoint", "holder")

    def search_q(self, term: str) -> Q | None:
        return any_of(endpoint_q(term, resolve_endpoint), uuid_q(term, "holder_id"))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned_endpoints(user))


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "endpoint",
        "seq",
        "state",
        "runner_kind",
        "ticket_id",
        "started_at",
        "deadline_at",
        "ended_at",
    )
    list_select_related = ("endpoint",)
    ordering = ("-id",)  # time-ordered primary key
    search_fields = ("id", "ticket", "endpoint")
    search_help_text = "A turn id, a ticket id (its turns), or an endpoint address."
    raw_id_fields = ("endpoint", "ticket")

    def search_q(self, term: str) -> Q | None:
        return any_of(uuid_q(term, "id", "ticket_id"), endpoint_q(term, resolve_endpoint))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned_endpoints(user))


@admin.register(ContextEntry)
class ContextEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "endpoint", "seq", "turn_id", "ticket_id", "created_at")
    list_select_related = ("endpoint",)
    list_defer = ("input", "result", "artifacts")
    ordering = ("-id",)
    search_fields = ("endpoint", "turn", "ticket")
    search_help_text = "An endpoint address (its history), a turn id or a ticket id."
    raw_id_fields = ("endpoint", "turn", "ticket")

    def search_q(self, term: str) -> Q | None:
        return any_of(endpoint_q(term, resolve_endpoint), uuid_q(term, "turn_id", "ticket_id"))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned_endpoints(user))
