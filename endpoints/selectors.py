"""Reads of the endpoint directory: resolving an address, who owns an
endpoint and who may submit to it, shared by tickets, the runtime, recovery
and the console."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from core.errors import NotFound
from core.times import iso

from .models import Endpoint, EndpointAlias, EndpointEvent


def resolve_endpoint(address: str) -> Endpoint:
    """The canonical endpoint for an address or one of its aliases."""
    if not isinstance(address, str) or not address:
        raise NotFound("endpoint address is empty")
    endpoint = Endpoint.objects.filter(address=address).first()
    if endpoint is None:
        alias = EndpointAlias.objects.select_related("endpoint").filter(alias=address).first()
        if alias is None:
            raise NotFound(f"endpoint {address!r} not found")
        endpoint = alias.endpoint
    return endpoint


def owned_endpoint_ids(user) -> list[int] | None:
    """The ids of the endpoints ``user`` owns; None for staff, who act as
    owners of every endpoint (callers read None as "no filter"). Endpoints
    are configuration (few rows): one small query through the user's groups,
    kept on the user object like Django's own permission cache, so a page
    that filters several panels asks once (a request loads its user afresh)."""
    if user is None or not user.is_authenticated:
        return []
    if user.is_staff:
        return None
    cached = getattr(user, "_claimcheck_owned_endpoints", None)
    if cached is None:
        cached = list(
            Endpoint.objects.filter(owners__user=user).order_by().values_list("id", flat=True)
        )
        user._claimcheck_owned_endpoints = cached
    return cached


def may_submit(user, endpoint: Endpoint) -> bool:
    """May ``user`` submit tickets to ``endpoint``? Anyone may, unless the
    endpoint is ``submit_restricted``: then the listed users, members of the
    listed groups, its owners and staff. One query, and only for a restricted
    endpoint."""
    if not endpoint.submit_restricted:
        return True
    if user is None or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    users = Endpoint.submitter_users.through.objects.filter(endpoint_id=endpoint.id)
    groups = Endpoint.submitter_groups.through.objects.filter(endpoint_id=endpoint.id)
    allowed = Q(id__in=users.values("user_id")) | Q(groups__in=groups.values("group_id"))
    if endpoint.owners_id is not None:
        allowed |= Q(groups__id=endpoint.owners_id)
    return get_user_model().objects.filter(allowed, id=user.id).exists()


def owners_may_submit(owners_id: int | None, endpoint: Endpoint) -> bool:
    """May the owners group ``owners_id`` (of another endpoint) submit to
    ``endpoint``? Yes when it is unrestricted, when the group owns it or is
    a listed submitter group, or when the group has active members and
    every one of them may submit (``may_submit``). Every member, not one:
    co-owners share what their endpoint does, so one owner's own right is
    not the others'. Queries only for a restricted endpoint."""
    if not endpoint.submit_restricted:
        return True
    if owners_id is None:
        return False
    if owners_id == endpoint.owners_id:
        return True
    groups = Endpoint.submitter_groups.through.objects.filter(endpoint_id=endpoint.id)
    if groups.filter(group_id=owners_id).exists():
        return True
    users = Endpoint.submitter_users.through.objects.filter(endpoint_id=endpoint.id)
    allowed = (
        Q(is_staff=True)
        | Q(id__in=users.values("user_id"))
        | Q(groups__in=groups.values("group_id"))
    )
    if endpoint.owners_id is not None:
        allowed |= Q(groups__id=endpoint.owners_id)
    members = get_user_model().objects.filter(groups__id=owners_id, is_active=True)
    permitted = get_user_model().objects.filter(allowed).values("id")
    return members.exists() and not members.exclude(id__in=permitted).exists()


def submitters_payload(endpoint: Endpoint) -> dict[str, list[str]] | None:
    """``{users, groups}`` (names, sorted) of a restricted endpoint, else None."""
    if not endpoint.submit_restricted:
        return None
    return {
        "users": sorted(endpoint.submitter_users.values_list("username", flat=True)),
        "groups": sorted(endpoint.submitter_groups.values_list("name", flat=True)),
    }


def is_owner(user, endpoint: Endpoint) -> bool:
    """Owners are the members of the endpoint's owners group; staff act as owners."""
    if user is None or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    return endpoint.owners_id is not None and user.groups.filter(id=endpoint.owners_id).exists()


def requires_second_person(endpoint: Endpoint) -> bool:
    """May a proposer not approve their own change? The endpoint's own
    setting, else the global CHANGE_REQUIRES_SECOND_PERSON."""
    from django.conf import settings

    if endpoint.change_requires_second_person is not None:
        return endpoint.change_requires_second_person
    return settings.CHANGE_REQUIRES_SECOND_PERSON


def sees_configuration(user, endpoint: Endpoint) -> bool:
    """May ``user`` see the endpoint's runner settings and who may submit to
    it (API.md "Runner details are for owners and staff")? Its owners and
    staff; everyone else sees the runner's kind only and no submitter list.
    Reads the user's cached owned ids, so a list asks once."""
    owned = owned_endpoint_ids(user)
    return owned is None or endpoint.id in owned


def pause_payload(endpoint: Endpoint, *, full: bool) -> dict[str, Any] | None:
    """The owners' pause: when; who and why only to owners and staff."""
    if endpoint.paused_at is None:
        return None
    if not full:
        return {"at": iso(endpoint.paused_at)}
    return {
        "at": iso(endpoint.paused_at),
        "by": endpoint.pause_actor,
        "reason": endpoint.pause_reason,
    }


def pause_events(endpoint: Endpoint, *, user, limit: int = 5) -> list[EndpointEvent]:
    """The endpoint's newest pauses and resumes (who, when, why): to its
    owners and staff, as the reasons are (``sees_configuration``); to anyone
    else none."""
    if not sees_configuration(user, endpoint):
        return []
    return list(
        EndpointEvent.objects.filter(endpoint=endpoint, kind__in=["paused", "resumed"]).order_by(
            "-id"
        )[:limit]
    )


def quarantine_case(endpoint_id: int) -> uuid.UUID | None:
    """The open recovery case of a quarantined endpoint, or None: recorded on
    the endpoint's row by the runtime's quarantine (``Endpoint.quarantine_case``)."""
    return Endpoint.objects.filter(id=endpoint_id).values_list("quarantine_case", flat=True).first()
