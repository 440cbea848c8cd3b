"""Domain errors: raised by services, mapped once to the documented JSON shape
``{"error": code, "detail": sentence, ...}`` (config/api.py)."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse


def error_body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The documented error body: ``{"error": code, "detail": sentence, ...}``."""
    return {"error": code, "detail": detail, **extra}


def error_response(
    status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JsonResponse:
    """An error answer in the documented shape, with ``headers``."""
    response = JsonResponse(error_body(code, detail, **extra), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def payload(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}

    def headers(self) -> dict[str, str]:
        """Response headers the error carries (none but for a few codes)."""
        return {}

    def response(self) -> JsonResponse:
        """This error as the API answers it: its status, body and headers."""
        return error_response(
            self.status, self.code, self.detail, headers=self.headers(), **self.extra
        )


class Invalid(DomainError):
    status, code = 400, "invalid"


class InvalidSearch(Invalid):
    """A search term that does not parse (tickets/search.py)."""

    status, code = 400, "invalid_search"


class Unauthenticated(DomainError):
    status, code = 401, "unauthenticated"


class Forbidden(DomainError):
    status, code = 403, "forbidden"


class NotFound(DomainError):
    status, code = 404, "not_found"


class DedupeConflict(DomainError):
    status, code = 409, "dedupe_conflict"


class StaleTurn(DomainError):
    status, code = 409, "stale_turn"


class InvalidTransition(DomainError):
    status, code = 409, "invalid_transition"


class EndpointBusy(DomainError):
    status, code = 409, "endpoint_busy"


class EndpointPaused(DomainError):
    """A paused endpoint whose busy policy is ``reject`` takes no new work
    (an ``enqueue`` one queues it until its owner resumes it)."""

    status, code = 409, "endpoint_paused"


class TooLarge(DomainError):
    status, code = 413, "too_large"


class EndpointQuarantined(DomainError):
    status, code = 423, "endpoint_quarantined"


class CircuitOpen(DomainError):
    status, code = 429, "circuit_open"


class TraceBudgetExhausted(DomainError):
    """The trace spent its token, cost or wall-clock budget (tickets/budgets.py):
    no wait clears it."""

    status, code = 429, "trace_budget_exhausted"


class RateLimited(DomainError):
    """The caller is over one of its fair-share limits (core/fairshare.py).
    The response carries ``Retry-After`` and the IETF draft's
    ``RateLimit-Limit`` / ``RateLimit-Remaining`` / ``RateLimit-Reset``."""

    status, code = 429, "rate_limited"

    def __init__(self, detail: str, *, limit: int, retry_after: int, **extra: Any) -> None:
        super().__init__(detail, limit=limit, retry_after=retry_after, **extra)
        self.limit = limit
        self.retry_after = max(1, int(retry_after))

    def headers(self) -> dict[str, str]:
        return {
            "Retry-After": str(self.retry_after),
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(self.retry_after),
        }


class StaleGeneration(DomainError):
    """A change made against an endpoint generation that is no longer the
    current one; the body carries the current number and what changed since."""

    status, code = 409, "stale_generation"


class SecondPersonRequired(DomainError):
    """The endpoint's changes need a second person: a proposer may not
    approve their own proposal."""

    status, code = 403, "second_person_required"
