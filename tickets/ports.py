"""What tickets needs to know about endpoints, without importing them.

The arrow between the two apps points one way: ``endpoints`` drives the
ticket lifecycle (the runtime starts, finishes and interrupts turns through
``tickets.lifecycle``) and imports ``tickets``; ``tickets`` never imports
``endpoints``. What admission, visibility, owner checks and the cancel of a
running ticket need about an endpoint is this small interface, which the
endpoints app provides at start-up (``EndpointsConfig.ready``).
import-linter (pyproject.toml) keeps the arrow one way.

Endpoints reach tickets as model instances through the ticket's foreign key
(``ticket.endpoint``); this interface passes them along untyped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class EndpointDirectory:
    # address or alias -> the canonical endpoint; NotFound otherwise.
    resolve: Callable[[str], Any]
    # (user, endpoint) -> may the user submit tickets to it?
    may_submit: Callable[[Any, Any], bool]
    # (user, endpoint) -> does the user own it (staff own every endpoint)?
    is_owner: Callable[[Any, Any], bool]
    # user -> ids of the endpoints the user owns; None means every endpoint.
    owned_ids: Callable[[Any], list[int] | None]
    # endpoint -> is it quarantined (admission refuses new work)?
    is_quarantined: Callable[[Any], bool]
    # endpoint -> does it reject new work while busy?
    rejects_when_busy: Callable[[Any], bool]
    # endpoint -> is its lock held by a turn?
    is_locked: Callable[[Any], bool]
    # endpoint id -> the id of its open recovery case, or None.
    open_case_id: Callable[[int], uuid.UUID | None]
    # (turn_id, reason, actor) -> ask the turn to stop; False if it was not running.
    request_interrupt: Callable[..., bool]


_directory: EndpointDirectory | None = None


def provide_endpoint_directory(directory: EndpointDirectory) -> None:
    global _directory
    _directory = directory


def endpoint_directory() -> EndpointDirectory:
    if _directory is None:
        raise ImproperlyConfigured(
            "no endpoint directory: the endpoints app provides one in its AppConfig.ready()"
        )
    return _directory
