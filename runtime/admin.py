"""View-only admin for the runtime's records: locks, turns, history
(core/readonly_admin.py says why and how)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q

from core.readonly_admin import ReadOnlyAdmin, any_of, endpoint_q, uuid_q
from endpoints.selectors import owned_endpoint_ids, resolve_endpoint

from .models import ContextEntry, EndpointLock, Turn


def _owned(user) -> list[int]:
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
        return queryset.filter(endpoint_id__in=_owned(user))


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
        return queryset.filter(endpoint_id__in=_owned(user))


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
        return queryset.filter(endpoint_id__in=_owned(user))
