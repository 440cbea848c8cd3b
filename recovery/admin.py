"""View-only admin for recovery records (core/readonly_admin.py says why
and how). Deciding a case is the owners' work through recovery/services.py,
from the console, the API or the commands: never here."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q

from core.readonly_admin import ReadOnlyAdmin, any_of, endpoint_q, uuid_q
from endpoints.selectors import resolve_endpoint

from .models import CaseEvidence, Decision, Inspection, Lesson, RecoveryCase
from .selectors import visible_cases


@admin.register(RecoveryCase)
class RecoveryCaseAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "endpoint",
        "state",
        "reason",
        "ticket_id",
        "turn_id",
        "opened_at",
        "decided_at",
        "closed_at",
    )
    list_filter = ("state",)  # three values; one case per quarantine, a small table
    list_select_related = ("endpoint",)
    ordering = ("-id",)  # time-ordered primary key
    search_fields = ("id", "ticket", "turn", "endpoint")
    search_help_text = "A case id, its ticket's or turn's id, or an endpoint address."
    raw_id_fields = ("endpoint", "turn", "ticket")

    def search_q(self, term: str) -> Q | None:
        return any_of(
            uuid_q(term, "id", "ticket_id", "turn_id"), endpoint_q(term, resolve_endpoint)
        )

    def owner_scope(self, queryset, user):
        return queryset.filter(id__in=visible_cases(user).values("id"))


@admin.register(CaseEvidence)
class CaseEvidenceAdmin(ReadOnlyAdmin):
    list_display = ("id", "case_id", "kind", "seq", "at")
    list_defer = ("detail",)
    ordering = ("-id",)
    search_fields = ("case",)
    search_help_text = "A case id: its late evidence."
    raw_id_fields = ("case",)

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "case_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(case_id__in=visible_cases(user).values("id"))


@admin.register(Inspection)
class InspectionAdmin(ReadOnlyAdmin):
    list_display = ("id", "case_id", "actor", "sha256", "created_at")
    list_select_related = ("actor",)
    list_defer = ("snapshot",)
    ordering = ("-id",)  # time-ordered primary key
    search_fields = ("id", "case")
    search_help_text = "An inspection id, or a case id: its inspections."
    raw_id_fields = ("case", "actor")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "id", "case_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(case_id__in=visible_cases(user).values("id"))


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "case_id",
        "action",
        "actor",
        "inspection_id",
        "rerun_ticket_id",
        "created_at",
    )
    list_filter = ("action",)
    list_select_related = ("actor",)
    ordering = ("-id",)  # time-ordered primary key
    search_fields = ("id", "case", "rerun_ticket")
    search_help_text = "A decision id, a case id, or a re-run ticket's id."
    raw_id_fields = ("case", "actor", "inspection", "rerun_ticket")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "id", "case_id", "rerun_ticket_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(case_id__in=visible_cases(user).values("id"))


@admin.register(Lesson)
class LessonAdmin(ReadOnlyAdmin):
    list_display = ("id", "case_id", "actor", "what_failed", "created_at")
    list_select_related = ("actor",)
    ordering = ("-id",)  # time-ordered primary key
    search_fields = ("id", "case")
    search_help_text = "A lesson id or its case's id."
    raw_id_fields = ("case", "actor")

    def search_q(self, term: str) -> Q | None:
        return uuid_q(term, "id", "case_id")

    def owner_scope(self, queryset, user):
        return queryset.filter(case_id__in=visible_cases(user).values("id"))
