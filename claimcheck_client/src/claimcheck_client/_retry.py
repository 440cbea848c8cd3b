"""When to repeat a request, and how long to wait first: shared by the sync
and async clients and the turn agent (the I/O loops live with them).

Written here rather than taken from tenacity (which the server uses): the
client depends on httpx alone, and its policy is small (which failures may
repeat, full-jitter backoff, ``Retry-After``)."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .errors import ClaimcheckError, TransportError, error_for

# The request never left this machine: no connection was made.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# The request may have reached the server; no answer came back.
_AMBIGUOUS = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.CloseError,
    httpx.RemoteProtocolError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` repeats after the first attempt. Waits are full-jitter
    exponential backoff, uniform in [0, min(cap, base * 2^n)], so many
    clients retrying against one struggling server spread out instead of
    arriving together; the ``Retry-After`` of a 503 or a 429 ``rate_limited``
    is honoured (up to ``max_retry_after``) with a little jitter on top."""

    retries: int = 5
    backoff_base: float = 0.25
    backoff_cap: float = 10.0
    max_retry_after: float = 60.0

    def backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))  # noqa: S311

    def after(self, retry_after: float | None, attempt: int) -> float:
        if retry_after is None:
            return self.backoff(attempt)
        wait = min(retry_after, self.max_retry_after)
        return wait + random.uniform(0, min(1.0, wait * 0.1))  # noqa: S311


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After``: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _retryable(response: httpx.Response) -> bool:
    """503 (the server briefly away) and a 429 that is a rate limit, ours
    (``rate_limited``) or a proxy's (no Claimcheck body), both of which name
    a time to come back; not ``circuit_open``, which no wait clears."""
    if response.status_code == 503:
        return True
    if response.status_code != 429:
        return False
    body = _body(response)
    code = body.get("error") if isinstance(body, dict) else None
    return code in (None, "rate_limited")


class Attempts:
    """The retry decisions of one call. Every call this package makes is
    safe to repeat: reads; a submission carries its dedupe key; a heartbeat
    is idempotent; a repeated cancel, ack or turn result that finds its own
    earlier effect (a 409 after an ``ambiguous`` attempt) is resolved by the
    caller. The caller's loop sends, then asks ``on_transport_error`` or
    ``on_response`` for a delay (repeat after it) or None (stop:
    ``raise_transport`` / ``finish``)."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        # An earlier attempt may have reached the server and acted: a
        # conflict on a later attempt may be that attempt's own effect.
        self.ambiguous = False

    def on_transport_error(self, exc: httpx.TransportError) -> float | None:
        unsent = isinstance(exc, _UNSENT)
        if not unsent:
            self.ambiguous = True
        if not isinstance(exc, _UNSENT + _AMBIGUOUS):
            return None  # e.g. an unsupported URL scheme: repeating will not help
        if self.attempt >= self.policy.retries:
            return None
        delay = self.policy.backoff(self.attempt)
        self.attempt += 1
        return delay

    def on_response(self, response: httpx.Response) -> float | None:
        if not _retryable(response) or self.attempt >= self.policy.retries:
            return None
        delay = self.policy.after(
            parse_retry_after(response.headers.get("Retry-After")), self.attempt
        )
        self.attempt += 1
        return delay

    def raise_transport(self, exc: httpx.TransportError) -> TransportError:
        err = TransportError(
            f"{type(exc).__name__}: {exc or 'no answer'} (after {self.attempt + 1} attempt(s))"
        )
        err.ambiguous = self.ambiguous
        return err

    def finish(self, response: httpx.Response) -> httpx.Response:
        """The answer, or its typed error."""
        if response.is_success:
            return response
        err: ClaimcheckError = error_for(
            response.status_code,
            _body(response),
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
        )
        err.ambiguous = self.ambiguous
        raise err
