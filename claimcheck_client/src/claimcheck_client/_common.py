"""Request shapes shared by the sync and async clients (no I/O here)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from . import __version__
from .errors import (
    ClaimcheckError,
    DedupeConflict,
    EndpointQuarantined,
    Forbidden,
    Invalid,
    InvalidTransition,
    NotFound,
)
from .models import ReturnTo, Ticket

USER_AGENT = f"claimcheck-client/{__version__}"
# The server's cap on ``wait_s`` (ADMISSION_MAX_WAIT_S, default 60).
SERVER_MAX_WAIT_S = 60.0

# A long poll that answers with one of these cannot go on (another user's
# ticket under a submit restriction, a server with a lower wait cap, an input
# that no longer hashes the same): fall back to polling ``GET``.
LONG_POLL_GIVE_UP = (Invalid, Forbidden, DedupeConflict, EndpointQuarantined, NotFound)


def api_root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/api/v1`` -> the API root."""
    root = base_url.rstrip("/")
    if root.endswith("/api/v1"):
        root = root[: -len("/api/v1")]
    return root + "/api/v1"


def headers(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}", "User-Agent": USER_AGENT}


def new_dedupe_key() -> str:
    return str(uuid.uuid4())


def submission(
    *,
    endpoint: str,
    input: Mapping[str, Any],  # noqa: A002 - the API's name
    dedupe_key: str,
    parent: str | uuid.UUID | None,
    trace_id: str | None,
    return_to: str | ReturnTo | Mapping[str, Any] | None,
    requester: Mapping[str, Any] | None,
    wait_s: float | None,
    budget: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"endpoint": endpoint, "input": dict(input), "dedupe_key": dedupe_key}
    if parent is not None:
        body["parent"] = str(parent)
    if trace_id is not None:
        body["trace_id"] = trace_id
    if return_to is not None:
        if isinstance(return_to, str):
            body["return_to"] = {"endpoint": return_to}
        elif isinstance(return_to, ReturnTo):
            body["return_to"] = {"endpoint": return_to.endpoint}
            if return_to.continuation is not None:
                body["return_to"]["continuation"] = return_to.continuation
        else:
            body["return_to"] = dict(return_to)
    if requester is not None:
        body["requester"] = dict(requester)
    if wait_s is not None:
        body["wait_s"] = wait_s
    if budget is not None:
        body["budget"] = dict(budget)
    return body


def long_poll_body(ticket: Ticket, wait_s: float) -> dict[str, Any]:
    """The same submission again, with ``wait_s``: the dedupe key makes it a
    read of ``ticket`` that the server answers once it is terminal."""
    return {
        "endpoint": ticket.endpoint,
        "input": ticket.input,
        "dedupe_key": ticket.dedupe_key,
        "wait_s": round(wait_s, 3),
    }


def answered_early(asked: float, wait_s: float) -> bool:
    """Did a long poll asked at ``asked`` (monotonic) come back unfinished
    well before its ``wait_s``? The server answers at once when it has no
    wait slot free for the caller (API.md "Fair share")."""
    return time.monotonic() - asked < wait_s / 2


def already_done(
    exc: ClaimcheckError, *, state: str | None = None, delivery: str | None = None
) -> bool:
    """After an attempt whose answer was lost, a 409 may be that attempt's
    own effect: cancel twice says the ticket is cancelled, ack twice says
    the delivery is delivered. True when the conflict shows the outcome."""
    if not (exc.ambiguous and isinstance(exc, InvalidTransition)):
        return False
    if state is not None and exc.body.get("state") == state:
        return True
    return delivery is not None and exc.body.get("delivery") == delivery
