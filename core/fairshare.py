"""Fair share per caller: one key cannot take every web thread, nor flood
admissions past what the others need (API.md "Fair share").

The subject is the user: every API key of a user and their console session
share one budget, so more keys do not buy more share. A key staff gave
limits of its own (``ApiKey.rate_limit_admissions``,
``rate_limit_concurrent_requests``) is its own subject instead, under its
limits (the settings' for the one it does not set). Three limits:

- **admissions**: ``RATE_LIMIT_ADMISSIONS`` (``limits`` notation, e.g.
  ``10/second;300/minute``), a moving window counted in Redis by the
  ``limits`` library; over it, ``POST /tickets`` is 429 ``rate_limited``
  before anything is looked up or written.
- **requests in flight**: ``RATE_LIMIT_CONCURRENT_REQUESTS`` across all web
  processes; the one over it is 429 ``rate_limited`` at once (API requests
  when their key is checked, console requests after the session is read;
  the console's live watches have their own per-process slots and are not
  counted here).
- **waits**: ``RATE_LIMIT_CONCURRENT_WAITS`` ``wait_s`` waits per user
  across all processes, and ``API_WAIT_SLOTS`` per process. A ``wait_s``
  that finds no free slot is not refused: its ticket was admitted, so the
  answer is the ticket as it stands, at once (the caller polls on). A call
  that is only a wait (MCP's ``wait_for_ticket``) is refused instead: 429
  ``rate_limited``.

Failed authentications are counted per **client address** instead (no
user is known): ``RATE_LIMIT_FAILED_AUTH``; past it, that address's requests
with a key not already verified in this process are 429 ``rate_limited``
before the key is looked up (``accounts.auth.ApiKeyAuth``, the API and
/mcp). Random bad keys all differ, so only the address can count them.

429s carry ``Retry-After`` and the IETF draft's ``RateLimit-Limit``,
``RateLimit-Remaining`` and ``RateLimit-Reset`` (seconds) headers.

Requests in flight are leases, not counters: a sorted set per user whose
members expire ``LEASE_S`` after they were taken, so a process killed in the
middle of a request frees its share by itself. ``limits`` counts rates, not
things in flight, hence the short script below beside it.

**Redis unreachable: fail open.** The limits protect the service's share,
not the ledger's correctness, so an outage of the counters must not become
an outage of the API: requests pass unlimited, a WARNING says so (at most
once per ``FAIL_OPEN_LOG_S`` per process), and Redis is not asked again for
``RETRY_REDIS_S`` so a hung server costs at most one short timeout per
process every few seconds. ``RATE_LIMIT_STORAGE_URL=memory://`` keeps the
counters in each process's memory instead.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import NamedTuple

from django.conf import settings
from limits import RateLimitItem, parse_many
from limits.storage import RedisStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from core.errors import RateLimited

log = logging.getLogger(__name__)

KEY_PREFIX = "claimcheck:fair"
# A lease outlives the longest request a web process serves (gunicorn's
# timeout is 75 s; a wait_s is at most ADMISSION_MAX_WAIT_S): a lease still
# held after this is a dead process's, and is dropped.
LEASE_MARGIN_S = 30.0
FAIL_OPEN_LOG_S = 10.0
RETRY_REDIS_S = 2.0
REDIS_TIMEOUT_S = 0.5

# KEYS[1]: the user's lease set; ARGV: now, expiry, member, limit, ttl (ms).
# Drops expired leases, then adds this one if the set holds fewer than limit.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[4]) then return held end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return -1
"""


class _State:
    lock = threading.Lock()
    down_until = 0.0
    logged_at = -math.inf
    local_leases: dict[str, dict[str, float]] = {}
    wait_slots: threading.BoundedSemaphore | None = None
    wait_slots_size = -1


def _storage_url() -> str:
    url = settings.RATE_LIMIT_STORAGE_URL
    return url or "memory://"


@lru_cache(maxsize=4)
def _storage_for(url: str) -> Storage:
    if url.startswith(("redis://", "rediss://", "redis+unix://")):
        return storage_from_string(
            url,
            key_prefix=KEY_PREFIX,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            socket_timeout=REDIS_TIMEOUT_S,
        )
    return storage_from_string(url)


def storage() -> Storage:
    return _storage_for(_storage_url())


@lru_cache(maxsize=16)
def _items(spec: str) -> tuple[RateLimitItem, ...]:
    return tuple(parse_many(spec)) if spec.strip() else ()


class KeyLimits(NamedTuple):
    """A key's own limits (None: the setting's; "" and 0: none), put on the
    user the key authenticated as (``KEY_LIMITS_ATTR``) by accounts/keys.py."""

    key_id: int
    admissions: str | None
    concurrent_requests: int | None


KEY_LIMITS_ATTR = "_claimcheck_key_limits"


def _own(user) -> KeyLimits | None:
    return getattr(user, KEY_LIMITS_ATTR, None)


def subject(user) -> str:
    own = _own(user)
    return f"key:{own.key_id}" if own is not None else f"user:{user.pk}"


def _admission_limit(user) -> tuple[str, str]:
    """The admissions spec for ``user`` and where it comes from (for the 429)."""
    own = _own(user)
    if own is not None and own.admissions is not None:
        return own.admissions, "this key's own limit"
    return settings.RATE_LIMIT_ADMISSIONS, "RATE_LIMIT_ADMISSIONS"


def _requests_limit(user) -> tuple[int, str]:
    own = _own(user)
    if own is not None and own.concurrent_requests is not None:
        return own.concurrent_requests, "this key's own limit"
    return settings.RATE_LIMIT_CONCURRENT_REQUESTS, "RATE_LIMIT_CONCURRENT_REQUESTS"


def _redis_usable() -> bool:
    return time.monotonic() >= _State.down_until


def _fail_open(what: str, exc: BaseException) -> None:
    """Let the request through; say so now and then."""
    from core.transient import describe

    now = time.monotonic()
    with _State.lock:
        _State.down_until = now + RETRY_REDIS_S
        if now - _State.logged_at < FAIL_OPEN_LOG_S:
            return
        _State.logged_at = now
    log.warning(
        "fair share: %s not counted, the rate-limit store is unreachable (%s); "
        "requests pass unlimited until it is back",
        what,
        describe(exc),
    )


# --- Admissions per window ------------------------------------------------------------------


def check_admission(user) -> None:
    """Count one admission of ``user``; 429 ``rate_limited`` when over
    ``RATE_LIMIT_ADMISSIONS`` (or its key's own). Nothing is counted for a
    refused one."""
    spec, source = _admission_limit(user)
    items = _items(spec)
    if not items or not _redis_usable():
        return
    _moving_window(
        items,
        "admissions",
        subject(user),
        count=True,
        over=lambda item: (
            f"over the admission limit of {item.amount} per {item.multiples} "
            f"{item.GRANULARITY.name} ({source}); retry after the Retry-After seconds"
        ),
        what="an admission",
    )


def _moving_window(items, namespace: str, key: str, *, count: bool, over, what: str) -> None:
    """Each window of ``items`` for ``key``: counted (``count``) or only
    tested; 429 ``rate_limited`` with ``over(item)`` and the window's reset
    as ``Retry-After`` at the first one used up. Any fault of the store
    fails open (``what`` names the check in the log)."""
    try:
        limiter = MovingWindowRateLimiter(storage())
        for item in items:
            if (limiter.hit if count else limiter.test)(item, namespace, key):
                continue
            reset_at = limiter.get_window_stats(item, namespace, key).reset_time
            raise RateLimited(
                over(item),
                limit=item.amount,
                retry_after=math.ceil(max(1.0, reset_at - time.time())),
            )
    except RateLimited:
        raise
    except Exception as exc:  # noqa: BLE001 - any fault of the store fails open
        _fail_open(what, exc)


# --- Failed authentications per client address ---------------------------------------------


def client_address(request) -> str | None:
    """The client's address: ``REMOTE_ADDR`` unless the operator says how
    many proxies stand in front of the app (``LOGIN_PROXY_COUNT``), then the
    address the outermost of them saw, counted from the right of
    ``X-Forwarded-For`` (everything to its left is whatever the client sent)."""
    proxies = settings.LOGIN_PROXY_COUNT
    if proxies > 0:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [h for h in hops if h]
        if len(hops) >= proxies:
            return hops[-proxies]
    return request.META.get("REMOTE_ADDR")


def check_failed_auth(address: str | None) -> None:
    """429 ``rate_limited`` when ``address`` has used up
    ``RATE_LIMIT_FAILED_AUTH`` (nothing is counted here)."""
    items = _items(settings.RATE_LIMIT_FAILED_AUTH)
    if not items or not address or not _redis_usable():
        return
    _moving_window(
        items,
        "failed_auth",
        address,
        count=False,
        over=lambda item: (
            f"over {item.amount} failed authentications per {item.multiples} "
            f"{item.GRANULARITY.name} from this address (RATE_LIMIT_FAILED_AUTH); retry "
            "after the Retry-After seconds"
        ),
        what="a failed authentication",
    )


def count_failed_auth(address: str | None) -> None:
    """Count one failed authentication from ``address``."""
    items = _items(settings.RATE_LIMIT_FAILED_AUTH)
    if not items or not address or not _redis_usable():
        return
    try:
        limiter = MovingWindowRateLimiter(storage())
        for item in items:
            limiter.hit(item, "failed_auth", address)
    except Exception as exc:  # noqa: BLE001 - any fault of the store fails open
        _fail_open("a failed authentication", exc)


# --- Leases: requests and waits in flight ---------------------------------------------------


def _lease_s() -> float:
    return max(settings.ADMISSION_MAX_WAIT_S, settings.CONSOLE_LIVE_WAIT_S) + LEASE_MARGIN_S


def _acquire(
    kind: str, key: str, limit: int, lease_s: float | None = None
) -> tuple[str | None, int]:
    """Take a lease on ``kind`` for ``key``: ``(member, -1)`` when taken,
    ``(None, held)`` when ``limit`` leases are held already; ``("", -1)``
    when the store is unreachable (fail open: nothing to release)."""
    member = uuid.uuid4().hex
    now = time.time()
    lease_s = lease_s or _lease_s()
    expiry = now + lease_s
    name = f"{KEY_PREFIX}:{kind}:{key}"
    try:
        store = storage()
    except Exception as exc:  # noqa: BLE001 - a store that cannot even be set up fails open
        _fail_open(f"a {kind} lease", exc)
        return "", -1
    if isinstance(store, RedisStorage):
        if not _redis_usable():
            return "", -1
        try:
            held = int(
                store.storage.eval(
                    _ACQUIRE, 1, name, now, expiry, member, limit, int(lease_s * 1000)
                )
            )
        except Exception as exc:  # noqa: BLE001 - any fault of the store fails open
            _fail_open(f"a {kind} lease", exc)
            return "", -1
        return (member, -1) if held < 0 else (None, held)
    with _State.lock:
        leases = _State.local_leases.setdefault(name, {})
        for old in [m for m, until in leases.items() if until <= now]:
            del leases[old]
        if len(leases) >= limit:
            return None, len(leases)
        leases[member] = expiry
    return member, -1


def _release(kind: str, key: str, member: str) -> None:
    if not member:
        return
    store = storage()  # it was set up for the lease being released
    name = f"{KEY_PREFIX}:{kind}:{key}"
    if isinstance(store, RedisStorage):
        try:
            store.storage.zrem(name, member)
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            _fail_open(f"a {kind} lease's release", exc)
        return
    with _State.lock:
        _State.local_leases.get(name, {}).pop(member, None)


REQUEST_LEASE_ATTR = "_claimcheck_fair_request"


def enter_request(request, user) -> None:
    """Count ``request`` among ``user``'s requests in flight until
    ``leave_request``; 429 ``rate_limited`` when they are at
    ``RATE_LIMIT_CONCURRENT_REQUESTS`` (or its key's own). Idempotent per
    request."""
    limit, source = _requests_limit(user)
    if limit <= 0 or getattr(request, REQUEST_LEASE_ATTR, None) is not None:
        return
    key = subject(user)
    member, held = _acquire("requests", key, limit)
    if member is None:
        raise RateLimited(
            f"{held} requests of this caller are in flight, its limit "
            f"({source}); retry when one has answered",
            limit=limit,
            retry_after=1,
        )
    setattr(request, REQUEST_LEASE_ATTR, (key, member))


def leave_request(request) -> None:
    lease = getattr(request, REQUEST_LEASE_ATTR, None)
    if lease is not None:
        setattr(request, REQUEST_LEASE_ATTR, None)
        _release("requests", *lease)


def _wait_slots() -> threading.BoundedSemaphore | None:
    size = settings.API_WAIT_SLOTS
    if size <= 0:
        return None
    with _State.lock:
        if _State.wait_slots is None or _State.wait_slots_size != size:  # tests change it
            _State.wait_slots, _State.wait_slots_size = threading.BoundedSemaphore(size), size
        return _State.wait_slots


@contextlib.contextmanager
def _wait_slot(user) -> Iterator[RateLimited | None]:
    """Yield None while ``user`` holds a wait slot (one of this process's
    ``API_WAIT_SLOTS`` and one of the user's ``RATE_LIMIT_CONCURRENT_WAITS``,
    0: no per-user limit), or the refusal saying which limit is full."""
    slots = _wait_slots()
    if slots is None or not slots.acquire(blocking=False):
        size = max(0, settings.API_WAIT_SLOTS)
        yield RateLimited(
            f"the {size} wait slots of this server process are taken (API_WAIT_SLOTS); "
            "retry when one has answered",
            limit=size,
            retry_after=1,
        )
        return
    try:
        limit = settings.RATE_LIMIT_CONCURRENT_WAITS
        if limit <= 0:
            yield None
            return
        key = subject(user)
        member, held = _acquire("waits", key, limit)
        if member is None:
            yield RateLimited(
                f"{held} waits of this caller are in flight, its limit "
                "(RATE_LIMIT_CONCURRENT_WAITS); retry when one has answered",
                limit=limit,
                retry_after=1,
            )
            return
        try:
            yield None
        finally:
            _release("waits", key, member)
    finally:
        slots.release()


@contextlib.contextmanager
def wait_slot(user) -> Iterator[bool]:
    """Yield whether ``user`` may hold a thread waiting now (``_wait_slot``).
    No slot is not an error: the caller answers with what it has (an
    admission's ``wait_s``: the ticket as it stands)."""
    with _wait_slot(user) as refusal:
        yield refusal is None


@contextlib.contextmanager
def required_wait_slot(user) -> Iterator[None]:
    """A wait slot for a call that is nothing but a wait (MCP's
    ``wait_for_ticket``): without one it is 429 ``rate_limited``, naming
    the limit that is full, rather than an answer that would have the
    caller call again at once."""
    with _wait_slot(user) as refusal:
        if refusal is not None:
            raise refusal
        yield


def stream_slot(user) -> Callable[[], None]:
    """Take what a ticket stream holds for its life (tickets/streams.py):
    one of this process's ``API_WAIT_SLOTS`` (a stream holds a thread, as
    a wait does) and one of ``user``'s ``RATE_LIMIT_CONCURRENT_STREAMS``
    leases, which outlives ``STREAM_MAX_S``. Returns the release (once is
    enough, twice is harmless); 429 ``rate_limited`` naming the limit that
    is full, before anything is streamed."""
    slots = _wait_slots()
    if slots is None or not slots.acquire(blocking=False):
        size = max(0, settings.API_WAIT_SLOTS)
        raise RateLimited(
            f"the {size} wait slots of this server process are taken (API_WAIT_SLOTS); "
            "retry when one has answered",
            limit=size,
            retry_after=1,
        )
    key, member = subject(user), ""
    limit = settings.RATE_LIMIT_CONCURRENT_STREAMS
    if limit > 0:
        lease_s = settings.STREAM_MAX_S + LEASE_MARGIN_S
        taken, held = _acquire("streams", key, limit, lease_s)
        if taken is None:
            slots.release()
            raise RateLimited(
                f"{held} streams of this caller are open, its limit "
                "(RATE_LIMIT_CONCURRENT_STREAMS); retry when one has ended",
                limit=limit,
                retry_after=1,
            )
        member = taken
    released = threading.Event()

    def release() -> None:
        with _State.lock:
            if released.is_set():
                return
            released.set()
        slots.release()
        _release("streams", key, member)

    return release


class FairShareMiddleware:
    """Releases a request's lease when it has answered (API keys take theirs
    in ``ApiKeyAuth``); takes one for a logged-in console user. After
    AuthenticationMiddleware."""

    EXEMPT = ("/api/", "/healthz", "/readyz", "/metrics", "/static/", "/live/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            user = None if request.path.startswith(self.EXEMPT) else _session_user(request)
            if user is not None:
                try:
                    enter_request(request, user)
                except RateLimited as exc:
                    return _console_refusal(exc)
            return self.get_response(request)
        finally:
            leave_request(request)


def _session_user(request):
    """The logged-in console user, or None. A database that is away while
    the session is read is the view's to meet (it answers 503 where its
    transient faults are handled): here it only means nothing is counted."""
    from core.transient import TRANSIENT_ERRORS

    user = getattr(request, "user", None)
    try:
        return user if user is not None and user.is_authenticated else None
    except TRANSIENT_ERRORS:
        return None


def _console_refusal(exc: RateLimited):
    from django.http import HttpResponse

    response = HttpResponse(
        f"Too many requests at once: {exc.detail}.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    for name, value in exc.headers().items():
        response[name] = value
    return response
