"""Endpoint configuration: create and change endpoints (never their state:
quarantine belongs to ``endpoints/runtime.py`` and recovery decisions)."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from config.errors import Invalid, NotFound

from .models import BusyPolicy, Endpoint, EndpointAlias, EndpointLock, RunnerKind
from .selectors import resolve_endpoint

ADDRESS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
BUDGET_FIELDS = ("turn_budget_s", "interrupt_grace_s", "heartbeat_timeout_s")
MAX_BUDGET_S = 7 * 24 * 3600


def validate_runner(runner: Any) -> dict[str, Any]:
    if not isinstance(runner, dict):
        raise Invalid("runner must be an object with a kind")
    kind = runner.get("kind")
    if kind == RunnerKind.PYTHON:
        path = runner.get("path")
        if not isinstance(path, str) or not re.fullmatch(r"[\w.]+\.[\w]+", path or ""):
            raise Invalid("a python runner needs path: a dotted path to a callable")
    elif kind == RunnerKind.COMMAND:
        argv = runner.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise Invalid("a command runner needs argv: a non-empty list of strings")
    elif kind == RunnerKind.HTTP:
        for key in ("url", "cancel_url"):
            url = runner.get(key)
            required = key == "url" or url is not None
            if required and (
                not isinstance(url, str) or not url.startswith(("http://", "https://"))
            ):
                raise Invalid(f"an http runner needs {key}: an http(s) URL")
    else:
        raise Invalid(f"runner kind must be one of {', '.join(RunnerKind.values)}")
    return runner


def _validate_settings(fields: dict[str, Any]) -> None:
    for name in BUDGET_FIELDS:
        if name in fields:
            value = fields[name]
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise Invalid(f"{name} must be a number of seconds")
            if not 0 < value <= MAX_BUDGET_S:
                raise Invalid(f"{name} must be above 0 and at most {MAX_BUDGET_S}")
    if "busy_policy" in fields and fields["busy_policy"] not in BusyPolicy.values:
        raise Invalid(f"busy_policy must be one of {', '.join(BusyPolicy.values)}")
    if "requires_approval" in fields and not isinstance(fields["requires_approval"], bool):
        raise Invalid("requires_approval must be true or false")


def _owners_group(address: str, usernames: list[str]) -> Group:
    users = list(get_user_model().objects.filter(username__in=usernames))
    missing = set(usernames) - {u.username for u in users}
    if missing:
        raise NotFound(f"unknown owner(s): {', '.join(sorted(missing))}")
    group, _ = Group.objects.get_or_create(name=f"owners:{address}")
    group.user_set.set(users)
    return group


def _set_aliases(endpoint: Endpoint, aliases: list[str]) -> None:
    for alias in aliases:
        if not isinstance(alias, str) or not ADDRESS_RE.match(alias):
            raise Invalid(f"alias {alias!r} is not a valid address")
        if alias == endpoint.address or Endpoint.objects.filter(address=alias).exists():
            raise Invalid(f"alias {alias!r} is already an endpoint's address")
    EndpointAlias.objects.filter(endpoint=endpoint).exclude(alias__in=aliases).delete()
    for alias in aliases:
        try:
            with transaction.atomic():
                EndpointAlias.objects.get_or_create(alias=alias, endpoint=endpoint)
        except IntegrityError:
            raise Invalid(f"alias {alias!r} already belongs to another endpoint") from None


def create_endpoint(
    *,
    address: str,
    runner: dict[str, Any],
    owners: list[str] | None = None,
    aliases: list[str] | None = None,
    **settings_: Any,
) -> Endpoint:
    if not isinstance(address, str) or not ADDRESS_RE.match(address):
        raise Invalid("address must be a lower-case slug: letters, digits, '.', '_' or '-'")
    validate_runner(runner)
    _validate_settings(settings_)
    with transaction.atomic():
        if (
            Endpoint.objects.filter(address=address).exists()
            or EndpointAlias.objects.filter(alias=address).exists()
        ):
            raise Invalid(f"address {address!r} is taken")
        endpoint = Endpoint.objects.create(
            address=address,
            runner=runner,
            owners=_owners_group(address, owners or []),
            **settings_,
        )
        # The lock row exists from the start: turns lock it, never create it.
        EndpointLock.objects.create(endpoint=endpoint)
        _set_aliases(endpoint, aliases or [])
    return endpoint


def update_endpoint(*, address: str, changes: dict[str, Any]) -> Endpoint:
    allowed = {*BUDGET_FIELDS, "busy_policy", "requires_approval", "runner", "aliases", "owners"}
    unknown = set(changes) - allowed
    if unknown:
        raise Invalid(f"cannot change {', '.join(sorted(unknown))}")
    _validate_settings(changes)
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(id=resolve_endpoint(address).id)
        fields = {k: v for k, v in changes.items() if k not in ("aliases", "owners")}
        if "runner" in fields:
            validate_runner(fields["runner"])
        for name, value in fields.items():
            setattr(endpoint, name, value)
        if fields:
            endpoint.save(update_fields=[*fields, "updated_at"])
        if "aliases" in changes:
            _set_aliases(endpoint, changes["aliases"] or [])
        if "owners" in changes:
            endpoint.owners = _owners_group(endpoint.address, changes["owners"] or [])
            endpoint.save(update_fields=["owners", "updated_at"])
    return endpoint
