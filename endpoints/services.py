"""Endpoint configuration: create and change endpoints (never their state:
quarantine belongs to the ``endpoints/runtime/`` package and recovery decisions), and
the append-only EndpointEvent record of every change."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone

from core import outbound
from core.errors import Invalid, NotFound

from . import runner_spec, runners
from .models import BusyPolicy, Endpoint, EndpointAlias, EndpointEvent, EndpointLock, RunnerKind
from .selectors import resolve_endpoint, submitters_payload

ADDRESS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
BUDGET_FIELDS = ("turn_budget_s", "interrupt_grace_s", "heartbeat_timeout_s")
MAX_BUDGET_S = (
    settings.MAX_TURN_BUDGET_S
)  # config/settings.py: below the broker's visibility timeout


def validate_runner(runner: Any) -> dict[str, Any]:
    """The runner's schema (``runner_spec``: its kind's fields only, typed,
    credentials only as named secrets), then the operator's allow-list
    (API.md: "Runners a staff key may set come from the operator's
    allow-list"): a python path or command executable outside it, or an
    http URL the webhook URL policy refuses (private, loopback and
    link-local hosts unless listed in DELIVERY_ALLOWED_HOSTS), is 400
    ``invalid`` naming the field or the runner."""
    runner_spec.check(runner)
    if runner["kind"] == RunnerKind.HTTP:
        for key in ("url", "cancel_url"):
            if runner.get(key) is not None:
                _check_runner_url(key, runner[key])
    refused = runners.not_allowed(runner)
    if refused:
        raise Invalid(refused, runner=runner)
    return runner


def _check_runner_url(key: str, url: str) -> None:
    """The outbound URL policy (core/outbound.py, the webhooks' too) for an
    agent's URL: the runtime POSTs there with a turn's credential, so it must
    not reach a host the operator has not allowed (server-side request
    forgery). The runner checks it again at send time."""
    try:
        outbound.validate_outbound_url(url, label="agent")
    except Invalid as exc:
        raise Invalid(f"http runner {key} {url!r} is not allowed: {exc.detail}") from None


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


def _owner_names(endpoint: Endpoint) -> list[str]:
    if endpoint.owners_id is None:
        return []
    return sorted(endpoint.owners.user_set.values_list("username", flat=True))


def _submitter_rows(submitters: Any) -> tuple[list, list[Group]] | None:
    """Validate ``{users: [username], groups: [group name]}`` (or None: anyone
    may submit) and load the rows. Unknown names are 400, naming them."""
    if submitters is None:
        return None
    if not isinstance(submitters, dict) or set(submitters) - {"users", "groups"}:
        raise Invalid("submitters must be null or {users: [username], groups: [group name]}")
    names: dict[str, list[str]] = {}
    for key in ("users", "groups"):
        value = submitters.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise Invalid(f"submitters.{key} must be a list of names")
        names[key] = value
    users = list(get_user_model().objects.filter(username__in=names["users"]))
    groups = list(Group.objects.filter(name__in=names["groups"]))
    missing = [
        *(f"user {n}" for n in sorted(set(names["users"]) - {u.username for u in users})),
        *(f"group {n}" for n in sorted(set(names["groups"]) - {g.name for g in groups})),
    ]
    if missing:
        raise Invalid(f"submitters: unknown {', '.join(missing)}")
    return users, groups


def _set_submitters(endpoint: Endpoint, rows: tuple[list, list[Group]] | None) -> None:
    endpoint.submit_restricted = rows is not None
    endpoint.save(update_fields=["submit_restricted", "updated_at"])
    users, groups = rows if rows is not None else ([], [])
    endpoint.submitter_users.set(users)
    endpoint.submitter_groups.set(groups)


def _record(endpoint: Endpoint, kind: str, actor: str, detail: dict[str, Any]) -> None:
    EndpointEvent.objects.create(
        endpoint=endpoint, kind=kind, actor=actor, detail=detail, at=timezone.now()
    )


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
    submitters: dict[str, list[str]] | None = None,
    actor: str = "",
    **settings_: Any,
) -> Endpoint:
    """Create an endpoint (runner checked against the operator's allow-list)
    with its lock row, aliases and who may submit (None: anyone); a
    ``created`` EndpointEvent records what it runs and for whom."""
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
        submitter_rows = _submitter_rows(submitters)
        endpoint = Endpoint.objects.create(
            address=address,
            runner=runner,
            owners=_owners_group(address, owners or []),
            **settings_,
        )
        # The lock row exists from the start: turns lock it, never create it.
        EndpointLock.objects.create(endpoint=endpoint)
        _set_aliases(endpoint, aliases or [])
        if submitter_rows is not None:
            _set_submitters(endpoint, submitter_rows)
        _record(
            endpoint,
            "created",
            actor,
            {
                "runner": runner,
                "owners": _owner_names(endpoint),
                "submitters": submitters_payload(endpoint),
                "aliases": sorted(aliases or []),
                **settings_,
            },
        )
    return endpoint


def update_endpoint(*, address: str, changes: dict[str, Any], actor: str = "") -> Endpoint:
    """Change an endpoint's configuration in one transaction (the endpoint
    row locked). A change of runner, owners or who may submit is an
    EndpointEvent each (``runner_changed``, ``owners_changed``,
    ``submitters_changed``, with from and to); other changed settings are one
    ``settings_changed``. A value equal to the current one records nothing."""
    allowed = {
        *BUDGET_FIELDS,
        "busy_policy",
        "requires_approval",
        "runner",
        "aliases",
        "owners",
        "submitters",
    }
    unknown = set(changes) - allowed
    if unknown:
        raise Invalid(f"cannot change {', '.join(sorted(unknown))}")
    _validate_settings(changes)
    if "runner" in changes:
        validate_runner(changes["runner"])
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(id=resolve_endpoint(address).id)
        fields = {k: v for k, v in changes.items() if k not in ("aliases", "owners", "submitters")}
        before = {name: getattr(endpoint, name) for name in fields}
        for name, value in fields.items():
            setattr(endpoint, name, value)
        if fields:
            endpoint.save(update_fields=[*fields, "updated_at"])
        if "runner" in fields and before["runner"] != fields["runner"]:
            _record(
                endpoint,
                "runner_changed",
                actor,
                {"from": before["runner"], "to": fields["runner"]},
            )
        settings_changed = {
            name: {"from": before[name], "to": value}
            for name, value in fields.items()
            if name != "runner" and before[name] != value
        }
        if "aliases" in changes:
            old_aliases = sorted(endpoint.aliases.values_list("alias", flat=True))
            _set_aliases(endpoint, changes["aliases"] or [])
            if old_aliases != sorted(changes["aliases"] or []):
                settings_changed["aliases"] = {
                    "from": old_aliases,
                    "to": sorted(changes["aliases"] or []),
                }
        if settings_changed:
            _record(endpoint, "settings_changed", actor, settings_changed)
        if "owners" in changes:
            old_owners = _owner_names(endpoint)
            endpoint.owners = _owners_group(endpoint.address, changes["owners"] or [])
            endpoint.save(update_fields=["owners", "updated_at"])
            new_owners = _owner_names(endpoint)
            if old_owners != new_owners:
                _record(endpoint, "owners_changed", actor, {"from": old_owners, "to": new_owners})
        if "submitters" in changes:
            old_submitters = submitters_payload(endpoint)
            _set_submitters(endpoint, _submitter_rows(changes["submitters"]))
            new_submitters = submitters_payload(endpoint)
            if old_submitters != new_submitters:
                _record(
                    endpoint,
                    "submitters_changed",
                    actor,
                    {"from": old_submitters, "to": new_submitters},
                )
    return endpoint


def add_owner(*, address: str, user, actor: str = "") -> Endpoint:
    """Make ``user`` one of the endpoint's accountable owners (the
    ``create_owner`` command), with an ``owners_changed`` event."""
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(id=resolve_endpoint(address).id)
        old_owners = _owner_names(endpoint)
        if endpoint.owners_id is None:
            group, _ = Group.objects.get_or_create(name=f"owners:{endpoint.address}")
            endpoint.owners = group
            endpoint.save(update_fields=["owners", "updated_at"])
        user.groups.add(endpoint.owners)
        new_owners = _owner_names(endpoint)
        if old_owners != new_owners:
            _record(endpoint, "owners_changed", actor, {"from": old_owners, "to": new_owners})
    return endpoint
