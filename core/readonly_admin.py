"""A view-only Django admin for the ledger's records, cheap on large tables.

Every state change goes through its service (tickets/lifecycle.py and
friends), so the admin never adds, changes or deletes anything: it shows.
Staff with the model's view permission (and superusers) can look.

Endpoint owners who are not staff may look too, at what they own: the
site (``config.admin_site``) lets them in, and each admin that declares
``owner_scope`` shows them only the rows of their endpoints (tickets: the
ones ``tickets.selectors.visible_tickets`` gives them, as in the console).
An admin without one stays staff-only, as does every other app's admin
(users, groups): owners hold no Django permission. Owners are never made
staff for this: staff see every ticket everywhere (``visible_tickets``).

Large tables stay cheap:

- no ``COUNT(*)`` over a whole table: the paginator counts at most
  ``COUNT_CAP + 1`` rows of the (filtered) query, and the page says "more
  than N" past that; ``show_full_result_count`` is off;
- search is exact and index-backed: each admin turns the term into lookups
  on indexed columns (``search_q``) instead of Django's ``icontains``
  across columns, which casts and scans;
- the change list defers big JSON columns (``list_defer``) and joins the
  foreign keys it shows (``list_select_related``); foreign keys render as
  read-only links, so no change page ever loads a select of every row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import cached_property, reduce
from operator import or_
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from core.errors import NotFound

COUNT_CAP = 1000


class CappedPaginator(Paginator):
    """``count`` is ``SELECT COUNT(*) FROM (SELECT ... LIMIT cap + 1)``: at most
    ``cap + 1`` index entries read, whatever the table's size. Pages past the
    cap are not linked; search or filter to narrow."""

    cap = COUNT_CAP

    @cached_property
    def count(self) -> int:
        counted = self.object_list.order_by()[: self.cap + 1].count()
        self.capped = counted > self.cap
        return min(counted, self.cap)

    capped = False


class LeanChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        defer = getattr(self.model_admin, "list_defer", ())
        return queryset.defer(*defer) if defer else queryset


def as_uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term)
    except ValueError:
        return None


def endpoint_q(term: str, resolve: Callable[[str], Any], field: str = "endpoint_id") -> Q | None:
    """``field`` = the endpoint an address (or alias) names: resolved first
    (``resolve``, the endpoints' own lookup, which raises ``NotFound``), one
    unique-index lookup, so the search filters on the id column that the
    record's own indexes lead with (never an OR across a join)."""
    try:
        return Q(**{field: resolve(term).id})
    except NotFound:
        return None


def uuid_q(term: str, *fields: str) -> Q | None:
    """Any of ``fields`` (primary or foreign keys, all indexed) = the term as a UUID."""
    value = as_uuid(term)
    return any_of(*(Q(**{f: value}) for f in fields)) if value else None


def any_of(*conditions: Q | None) -> Q | None:
    present = [c for c in conditions if c is not None]
    return reduce(or_, present) if present else None


class ReadOnlyAdmin(admin.ModelAdmin):
    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 50
    list_max_show_all = 200
    actions = None
    # Columns the change list does not load (large JSON); the change page does.
    list_defer: tuple[str, ...] = ()
    # The search box shows when this is set; ``search_q`` does the searching.
    search_fields: tuple[str, ...] = ()

    def owner_scope(self, queryset: QuerySet, user) -> QuerySet | None:
        """The rows an endpoint owner who is not staff may see; None: the
        model is staff-only (the default)."""
        return None

    def _scoped(self, request: HttpRequest) -> bool:
        """A caller who is not staff, let in by the site (an owner), on an
        admin that declares what owners see."""
        return type(
            self
        ).owner_scope is not ReadOnlyAdmin.owner_scope and self.admin_site.has_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        if request.user.is_staff:
            return queryset
        scoped = self.owner_scope(queryset, request.user) if self._scoped(request) else None
        return queryset.none() if scoped is None else scoped

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        if request.user.is_staff:
            return super().has_view_permission(request, obj)
        if not self._scoped(request):
            return False
        return obj is None or self.get_queryset(request).filter(pk=obj.pk).exists()

    def has_module_permission(self, request: HttpRequest) -> bool:
        if request.user.is_staff:
            return super().has_module_permission(request)
        return self._scoped(request)

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> list[str]:
        # Every field read-only: the change page builds no form field at all
        # (no select of every related row, no widget for a value nobody may set).
        return [f.name for f in self.model._meta.concrete_fields]

    def get_changelist(self, request: HttpRequest, **kwargs):
        return LeanChangeList

    def search_q(self, term: str) -> Q | None:
        """The rows a search term names, as lookups on indexed columns
        (None: nothing can match)."""
        return None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = self.search_q(term)
        return (queryset.filter(condition) if condition is not None else queryset.none()), False
