"""View-only admin for the endpoint directory
(core/readonly_admin.py says why and how)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q

from core.readonly_admin import ReadOnlyAdmin, any_of, endpoint_q, uuid_q

from .models import (
    ChangeProposal,
    ChangeReview,
    Endpoint,
    EndpointAlias,
    EndpointGeneration,
    RouteGeneration,
)
from .selectors import owned_endpoint_ids, resolve_endpoint


def _owned(user) -> list[int]:
    """The endpoints ``user`` owns (the console's rule; staff never get here)."""
    return owned_endpoint_ids(user) or []


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = (
        "address",
        "state",
        "paused_at",
        "owners",
        "busy_policy",
        "requires_approval",
        "turn_budget_s",
        "interrupt_grace_s",
        "heartbeat_timeout_s",
        "turn_seq",
    )
    list_filter = ("state", "busy_policy")  # a small table of a few values each
    list_select_related = ("owners",)
    ordering = ("address",)
    search_fields = ("address",)
    search_help_text = "The start of an address, or an alias."
    raw_id_fields = ("owners",)

    def search_q(self, term: str) -> Q | None:
        # A unique CharField has a varchar_pattern_ops index on PostgreSQL:
        # a case-sensitive prefix match uses it.
        return any_of(Q(address__startswith=term), endpoint_q(term, resolve_endpoint, "id"))

    def owner_scope(self, queryset, user):
        return queryset.filter(id__in=_owned(user))


@admin.register(EndpointAlias)
class EndpointAliasAdmin(ReadOnlyAdmin):
    list_display = ("alias", "endpoint")
    list_select_related = ("endpoint",)
    ordering = ("alias",)
    search_fields = ("alias", "endpoint")
    search_help_text = "The start of an alias, or the endpoint's address."
    raw_id_fields = ("endpoint",)

    def search_q(self, term: str) -> Q | None:
        return any_of(Q(alias__startswith=term), endpoint_q(term, resolve_endpoint))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned(user))


# --- Governed change: append-only evidence ------------------------------------------------------


@admin.register(EndpointGeneration)
class EndpointGenerationAdmin(ReadOnlyAdmin):
    list_display = ("endpoint", "number", "actor", "reason", "proposal_id", "restores", "at")
    list_select_related = ("endpoint",)
    ordering = ("-id",)
    search_fields = ("endpoint", "proposal")
    search_help_text = "An endpoint address (its generations), or a proposal id."
    raw_id_fields = ("endpoint", "proposal")

    def search_q(self, term: str) -> Q | None:
        return any_of(endpoint_q(term, resolve_endpoint), uuid_q(term, "proposal_id"))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned(user))


@admin.register(ChangeProposal)
class ChangeProposalAdmin(ReadOnlyAdmin):
    list_display = ("id", "endpoint", "base_generation", "proposer", "created_at")
    list_select_related = ("endpoint", "proposer")
    ordering = ("-created_at",)
    search_fields = ("id", "endpoint")
    search_help_text = "A proposal id, or an endpoint address (its proposals)."
    raw_id_fields = ("endpoint", "proposer")

    def search_q(self, term: str) -> Q | None:
        return any_of(uuid_q(term, "id"), endpoint_q(term, resolve_endpoint))

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned(user))


@admin.register(ChangeReview)
class ChangeReviewAdmin(ReadOnlyAdmin):
    list_display = ("id", "proposal_id", "verdict", "reviewer", "generation", "at")
    list_select_related = ("reviewer",)
    ordering = ("-at",)
    search_fields = ("id", "proposal")
    search_help_text = "A review id or a proposal id."
    raw_id_fields = ("proposal", "reviewer")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "id", "proposal_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(proposal__endpoint_id__in=_owned(user))


@admin.register(RouteGeneration)
class RouteGenerationAdmin(ReadOnlyAdmin):
    list_display = ("alias", "number", "endpoint", "actor", "reason", "at")
    list_select_related = ("endpoint",)
    ordering = ("alias", "number")
    search_fields = ("alias",)
    search_help_text = "An alias (its route generations)."
    raw_id_fields = ("endpoint",)

    def search_q(self, term: str) -> Q | None:
        # The unique (alias, number) index leads with the alias.
        return Q(alias=term)

    def owner_scope(self, queryset, user):
        return queryset.filter(endpoint_id__in=_owned(user))
