"""Endpoint configuration: create and change endpoints (never their state:
quarantine belongs to the runtime's ``runtime/turns/`` package and recovery
decisions; an owner's pause to ``runtime/services.py``, which needs the
running turn), and the append-only records of every change: EndpointEvent,
EndpointGeneration (the behaviour-defining fields, versioned) and
RouteGeneration (where an alias points)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core import limits, outbound
from core.errors import Invalid, NotFound, StaleGeneration

from . import runner_spec
from .models import (
    GENERATION_FIELDS,
    BusyPolicy,
    Endpoint,
    EndpointAlias,
    EndpointEvent,
    EndpointGeneration,
    RouteGeneration,
    RunnerKind,
)
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
    refused = runner_spec.not_allowed(runner)
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
    if "notes" in fields:
        notes = fields["notes"]
        if not isinstance(notes, str) or len(notes) > limits.NOTE_CHARS:
            raise Invalid(f"notes must be text of at most {limits.NOTE_CHARS} characters")
    if "change_requires_second_person" in fields and not isinstance(
        fields["change_requires_second_person"], bool | None
    ):
        raise Invalid("change_requires_second_person must be true, false or null")


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


def record_event(endpoint: Endpoint, kind: str, actor: str, detail: dict[str, Any]) -> None:
    EndpointEvent.objects.create(
        endpoint=endpoint, kind=kind, actor=actor, detail=detail, at=timezone.now()
    )


def _set_aliases(endpoint: Endpoint, aliases: list[str], *, actor: str = "") -> None:
    for alias in aliases:
        if not isinstance(alias, str) or not ADDRESS_RE.match(alias):
            raise Invalid(f"alias {alias!r} is not a valid address")
        if alias == endpoint.address or Endpoint.objects.filter(address=alias).exists():
            raise Invalid(f"alias {alias!r} is already an endpoint's address")
    removed = list(
        EndpointAlias.objects.filter(endpoint=endpoint)
        .exclude(alias__in=aliases)
        .values_list("alias", flat=True)
    )
    EndpointAlias.objects.filter(endpoint=endpoint, alias__in=removed).delete()
    for alias in removed:
        _route_generation(alias, None, actor=actor, reason="alias removed")
    for alias in aliases:
        try:
            with transaction.atomic():
                _, created = EndpointAlias.objects.get_or_create(alias=alias, endpoint=endpoint)
        except IntegrityError:
            raise Invalid(
                f"alias {alias!r} already belongs to another endpoint (move it: "
                "POST /endpoints/{address}/routes)"
            ) from None
        if created:
            _route_generation(alias, endpoint, actor=actor, reason="alias added")


def _route_generation(alias: str, endpoint: Endpoint | None, *, actor: str, reason: str) -> int:
    """Append the alias's next route generation (where it points now). The
    caller holds the alias row (or has just created or deleted it), so two
    changes of one route take turns; the unique (alias, number) refuses a
    number written twice."""
    last = (
        RouteGeneration.objects.filter(alias=alias)
        .order_by("-number")
        .values_list("number", flat=True)
    ).first() or 0
    RouteGeneration.objects.create(
        alias=alias,
        number=last + 1,
        endpoint=endpoint,
        actor=actor,
        reason=reason,
        at=timezone.now(),
    )
    return last + 1


def move_alias(*, alias: str, to_address: str, reason: str, actor: str = "") -> RouteGeneration:
    """Point ``alias`` at another endpoint: a new route generation, in one
    transaction with the alias row locked. Tickets admitted through it
    before stay and finish where they were admitted; their dedupe keys keep
    their identity through the alias (claimcheck_admit looks a key up on
    every endpoint the alias pointed to: docs/explanation/design.md, "Routes that
    move"). The lock on the alias row also waits out every admission that
    read the old route and has not committed yet (they hold it FOR SHARE)."""
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("a move needs a reason")
    with transaction.atomic():
        row = EndpointAlias.objects.select_for_update().filter(alias=alias).first()
        if row is None:
            raise NotFound(f"alias {alias!r} not found")
        # Not locked: admissions to the target take its key-share lock.
        target = Endpoint.objects.filter(address=to_address).first()
        if target is None:
            raise NotFound(f"endpoint {to_address!r} not found")
        if target.id == row.endpoint_id:
            raise Invalid(f"alias {alias!r} already points to {to_address}")
        source = row.endpoint
        EndpointAlias.objects.filter(alias=alias, endpoint_id=source.id).update(endpoint=target)
        number = _route_generation(alias, target, actor=actor, reason=reason)
        detail = {"alias": alias, "from": source.address, "to": target.address, "route": number}
        record_event(source, "route_moved", actor, {**detail, "reason": reason})
        record_event(target, "route_moved", actor, {**detail, "reason": reason})
    return RouteGeneration.objects.get(alias=alias, number=number)


# --- Generations ------------------------------------------------------------------------------


def config_of(endpoint: Endpoint) -> dict[str, Any]:
    """The behaviour-defining configuration, as a generation records it."""
    return {name: getattr(endpoint, name) for name in GENERATION_FIELDS}


def config_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """{field: {from, to}} for every field whose value differs."""
    return {
        name: {"from": before.get(name), "to": after[name]}
        for name in GENERATION_FIELDS
        if name in after and before.get(name) != after[name]
    }


def validate_config_changes(changes: Any) -> dict[str, Any]:
    """A change of generation fields only, each valid (400 naming it)."""
    if not isinstance(changes, dict) or not changes:
        raise Invalid(f"changes must name at least one of {', '.join(GENERATION_FIELDS)}")
    unknown = set(changes) - set(GENERATION_FIELDS)
    if unknown:
        raise Invalid(f"cannot change {', '.join(sorted(unknown))} through a generation")
    _validate_settings(changes)
    if "runner" in changes:
        validate_runner(changes["runner"])
    return changes


def _first_generation(endpoint: Endpoint, actor: str) -> None:
    EndpointGeneration.objects.create(
        endpoint=endpoint,
        number=1,
        config=config_of(endpoint),
        changes={},
        actor=actor,
        reason="created",
        at=timezone.now(),
    )


def change_generation(
    *,
    endpoint_id: int,
    changes: dict[str, Any],
    actor: str,
    reason: str,
    expected_generation: int | None = None,
    proposal_id: Any = None,
    restores: int | None = None,
) -> EndpointGeneration | None:
    """Apply ``changes`` (generation fields, validated) as the endpoint's
    next generation. The one way these fields change:

    1. Lock the endpoint row. ``expected_generation`` not current: refused
       with ``stale_generation``, naming the current number and the diff
       since the expected one; nothing written.
    2. Nothing differs from the current values: no generation (None).
    3. One conditional UPDATE (``generation = N``) writes the new values and
       N+1; then the EndpointGeneration row N+1 (config, diff, who, why) in
       the same transaction. A turn already started keeps the generation it
       recorded; the next one starts under N+1.
    """
    validate_config_changes(changes)
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(id=endpoint_id)
        current = endpoint.generation
        if expected_generation is not None and expected_generation != current:
            raise StaleGeneration(
                f"{endpoint.address} is at generation {current}, not {expected_generation}: "
                "review the change against the current one",
                generation=current,
                since=changes_since(endpoint, expected_generation),
            )
        before = config_of(endpoint)
        diff = config_diff(before, {**before, **changes})
        if not diff:
            return None
        fields = {name: changes[name] for name in diff}
        now = timezone.now()
        updated = Endpoint.objects.filter(id=endpoint.id, generation=current).update(
            generation=F("generation") + 1, updated_at=now, **fields
        )
        if updated != 1:  # the row is locked: only a bug reaches this
            raise StaleGeneration(f"{endpoint.address} moved past generation {current}")
        generation = EndpointGeneration.objects.create(
            endpoint=endpoint,
            number=current + 1,
            config={**before, **fields},
            changes=diff,
            actor=actor,
            reason=reason,
            proposal_id=proposal_id,
            restores=restores,
            first_seq=endpoint.turn_seq + 1,
            at=now,
        )
        # The endpoint's event timeline shows the change as before: the runner
        # on its own, the other fields together; the generation has the why.
        if "runner" in diff:
            record_event(endpoint, "runner_changed", actor, diff["runner"])
        others = {name: change for name, change in diff.items() if name != "runner"}
        if others:
            record_event(endpoint, "settings_changed", actor, others)
    return generation


def changes_since(endpoint: Endpoint, number: int) -> dict[str, Any]:
    """The diff from generation ``number`` to the current one."""
    then = (
        EndpointGeneration.objects.filter(endpoint=endpoint, number=number)
        .values_list("config", flat=True)
        .first()
    )
    return config_diff(then or {}, config_of(endpoint))


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
        _set_aliases(endpoint, aliases or [], actor=actor)
        if submitter_rows is not None:
            _set_submitters(endpoint, submitter_rows)
        _first_generation(endpoint, actor)
        record_event(
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


def update_endpoint(
    *,
    address: str,
    changes: dict[str, Any],
    actor: str = "",
    reason: str = "",
    expected_generation: int | None = None,
) -> Endpoint:
    """Change an endpoint's configuration in one transaction (the endpoint
    row locked). The behaviour-defining fields (GENERATION_FIELDS) change
    through ``change_generation``: one new generation with ``reason``,
    conditional on ``expected_generation`` when given. A change of owners
    or who may submit is an EndpointEvent each (``owners_changed``,
    ``submitters_changed``, with from and to); aliases a
    ``settings_changed``, and a route generation each. A value equal to the
    current one records nothing."""
    allowed = {
        *GENERATION_FIELDS,
        "change_requires_second_person",
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
    config_changes = {k: v for k, v in changes.items() if k in GENERATION_FIELDS}
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(id=resolve_endpoint(address).id)
        if config_changes:
            change_generation(
                endpoint_id=endpoint.id,
                changes=config_changes,
                actor=actor,
                reason=reason or "changed by staff (PATCH)",
                expected_generation=expected_generation,
            )
            endpoint.refresh_from_db()
        if "change_requires_second_person" in changes:
            before = endpoint.change_requires_second_person
            endpoint.change_requires_second_person = changes["change_requires_second_person"]
            endpoint.save(update_fields=["change_requires_second_person", "updated_at"])
            if before != endpoint.change_requires_second_person:
                record_event(
                    endpoint,
                    "settings_changed",
                    actor,
                    {
                        "change_requires_second_person": {
                            "from": before,
                            "to": endpoint.change_requires_second_person,
                        }
                    },
                )
        if "aliases" in changes:
            old_aliases = sorted(endpoint.aliases.values_list("alias", flat=True))
            _set_aliases(endpoint, changes["aliases"] or [], actor=actor)
            if old_aliases != sorted(changes["aliases"] or []):
                record_event(
                    endpoint,
                    "settings_changed",
                    actor,
                    {"aliases": {"from": old_aliases, "to": sorted(changes["aliases"] or [])}},
                )
        if "owners" in changes:
            old_owners = _owner_names(endpoint)
            endpoint.owners = _owners_group(endpoint.address, changes["owners"] or [])
            endpoint.save(update_fields=["owners", "updated_at"])
            new_owners = _owner_names(endpoint)
            if old_owners != new_owners:
                record_event(
                    endpoint, "owners_changed", actor, {"from": old_owners, "to": new_owners}
                )
        if "submitters" in changes:
            old_submitters = submitters_payload(endpoint)
            _set_submitters(endpoint, _submitter_rows(changes["submitters"]))
            new_submitters = submitters_payload(endpoint)
            if old_submitters != new_submitters:
                record_event(
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
            record_event(endpoint, "owners_changed", actor, {"from": old_owners, "to": new_owners})
    return endpoint


# --- Pause and resume (docs/explanation/design.md, "Pause") -----------------------------------


def required_reason(reason: Any, what: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise Invalid(f"a {what} needs a reason")
    reason = reason.strip()
    if len(reason) > limits.NOTE_CHARS:
        raise Invalid(f"the reason is longer than {limits.NOTE_CHARS} characters")
    return reason


# --- A worker's consuming (docs/howto/operations.md, "Draining a worker") ------------------
