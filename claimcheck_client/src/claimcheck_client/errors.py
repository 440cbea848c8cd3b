"""Typed exceptions, one per documented error code (shared/API.md, Errors)."""

from __future__ import annotations

from typing import Any


class ClaimcheckError(Exception):
    """An error answer of the API, or a request that could not be completed.

    ``code`` and ``detail`` are the server's ``error`` and ``detail``;
    ``status`` its HTTP status (None when no answer arrived); ``body`` the
    whole error body (extra fields such as ``ticket``, ``state``, ``case``).
    ``ambiguous`` is true when an earlier attempt of the same call may have
    reached the server before this error (its answer was lost).
    """

    code: str = "error"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.status = status
        self.body: dict[str, Any] = body or {}
        self.retry_after = retry_after
        self.ambiguous = False

    def __str__(self) -> str:
        status = f" ({self.status})" if self.status is not None else ""
        return f"{self.code}{status}: {self.detail}"


class Invalid(ClaimcheckError):
    """400/422: a malformed body or an unknown field value."""

    code = "invalid"


class Unauthenticated(ClaimcheckError):
    code = "unauthenticated"


class Forbidden(ClaimcheckError):
    code = "forbidden"


class NotFound(ClaimcheckError):
    code = "not_found"


class DedupeConflict(ClaimcheckError):
    """409: the dedupe key already names a ticket with a different input."""

    code = "dedupe_conflict"

    @property
    def ticket(self) -> str | None:
        return self.body.get("ticket")


class StaleTurn(ClaimcheckError):
    """409: not the current exact turn (the server kept it as evidence only)."""

    code = "stale_turn"


class InvalidTransition(ClaimcheckError):
    code = "invalid_transition"

    @property
    def state(self) -> str | None:
        return self.body.get("state")


class EndpointBusy(ClaimcheckError):
    code = "endpoint_busy"


class EndpointPaused(ClaimcheckError):
    """409: the endpoint's owners paused it and it rejects new work while
    paused (busy policy ``reject``); retry once it is resumed."""

    code = "endpoint_paused"


class TooLarge(ClaimcheckError):
    code = "too_large"


class EndpointQuarantined(ClaimcheckError):
    """423: the endpoint fails closed until an owner decides its case."""

    code = "endpoint_quarantined"

    @property
    def case(self) -> str | None:
        return self.body.get("case")


class CircuitOpen(ClaimcheckError):
    """429: the trace reached its hard limit of tickets."""

    code = "circuit_open"

    @property
    def trace_id(self) -> str | None:
        return self.body.get("trace_id")


class TraceBudgetExhausted(ClaimcheckError):
    """429: the trace spent its token, cost or wall-clock budget."""

    code = "trace_budget_exhausted"

    @property
    def trace_id(self) -> str | None:
        return self.body.get("trace_id")


class RateLimited(ClaimcheckError):
    """429: this caller is over one of its fair-share limits (admissions per
    window, requests in flight). Retried after its ``Retry-After`` like a
    503; raised only once the client's retries are used up."""

    code = "rate_limited"

    @property
    def limit(self) -> int | None:
        return self.body.get("limit")


class Unavailable(ClaimcheckError):
    """503: the server's database or broker is briefly unreachable. Raised
    only once the client's retries are used up."""

    code = "unavailable"


class TransportError(ClaimcheckError):
    """No answer: the connection failed, timed out or was dropped, and the
    retries are used up (or the call was not safe to repeat). The httpx
    exception is the ``__cause__``."""

    code = "transport"


class WebhookVerificationError(Exception):
    """A webhook whose signature, id or timestamp does not verify."""


BY_CODE: dict[str, type[ClaimcheckError]] = {
    cls.code: cls
    for cls in (
        Invalid,
        Unauthenticated,
        Forbidden,
        NotFound,
        DedupeConflict,
        StaleTurn,
        InvalidTransition,
        EndpointBusy,
        EndpointPaused,
        TooLarge,
        EndpointQuarantined,
        CircuitOpen,
        TraceBudgetExhausted,
        RateLimited,
        Unavailable,
    )
}
BY_STATUS: dict[int, type[ClaimcheckError]] = {
    400: Invalid,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    413: TooLarge,
    422: Invalid,
    423: EndpointQuarantined,
    # A 429 without a Claimcheck body is a proxy's rate limit, not a trace's.
    429: RateLimited,
    503: Unavailable,
}


def error_for(status: int, body: Any, *, retry_after: float | None = None) -> ClaimcheckError:
    """The typed exception for an error answer: by its documented ``error``
    code, else by status (a proxy's HTML 503 is still ``Unavailable``)."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code = body["error"]
        detail = str(body.get("detail") or code)
        cls = BY_CODE.get(code) or BY_STATUS.get(status, ClaimcheckError)
        return cls(detail, code=code, status=status, body=body, retry_after=retry_after)
    cls = BY_STATUS.get(status, ClaimcheckError)
    return cls(
        f"the server answered {status} without a Claimcheck error body",
        code=cls.code if cls is not ClaimcheckError else "http_error",
        status=status,
        body={},
        retry_after=retry_after,
    )
