"""API keys: ``cc_<prefix>_<secret>``; only a SHA-256 of the whole key is
stored (the key has 256 bits of entropy, so a slow hash adds nothing).

A key verified against its row is remembered in this process for
``API_KEY_CACHE_S`` seconds (at most ``API_KEY_CACHE_SIZE`` keys, least
recently used dropped first), so a client's steady stream of requests costs
one query per key per process per TTL instead of one per request. The cache
is keyed by the key's SHA-256 (the stored hash), never the key, and holds
the user's row minus its password; each request gets a fresh user object.
Revoking a key or saving its user (e.g. deactivating them) through the app
drops the entries in this process at once; other processes see it within
the TTL.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable

from cachetools import TTLCache
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS
from django.db.models.base import ModelState
from django.utils import timezone

from core.fairshare import KEY_LIMITS_ATTR, KeyLimits

from .models import ApiKey


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(
    *,
    username: str,
    name: str = "",
    staff: bool = False,
    rate_limit_admissions: str | None = None,
    rate_limit_concurrent_requests: int | None = None,
) -> tuple[ApiKey, str]:
    """Create the user if missing; returns the row and the plain key (shown
    once). The limits are the key's own fair share (core/fairshare.py; None:
    the settings'); a spec ``limits`` cannot read is a ValueError."""
    if rate_limit_admissions:
        from limits import parse_many

        parse_many(rate_limit_admissions)  # ValueError naming what it could not read
    if rate_limit_concurrent_requests is not None and rate_limit_concurrent_requests < 0:
        raise ValueError("rate_limit_concurrent_requests must be 0 (no limit) or more")
    user, _ = get_user_model().objects.get_or_create(username=username)
    if staff and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    prefix = secrets.token_hex(6)
    key = f"cc_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        key_hash=_hash(key),
        rate_limit_admissions=rate_limit_admissions,
        rate_limit_concurrent_requests=rate_limit_concurrent_requests,
    )
    return row, key


def revoke_api_key(prefix: str) -> bool:
    """Revoke the key with this prefix, if it is not already revoked (one
    conditional UPDATE). It stops working in this process at once and in
    the others within ``API_KEY_CACHE_S``. Returns whether it was revoked now."""
    row = ApiKey.objects.filter(prefix=prefix).only("id", "key_hash").first()
    if row is None:
        return False
    revoked = bool(
        ApiKey.objects.filter(id=row.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    )
    key_cache.forget_key(row.key_hash)
    return revoked


# --- The cache of verified keys ----------------------------------------------------------

# Never the password hash: the API never reads it (a deferred field loads on access).
_USER_FIELDS: list[str] | None = None


def _user_fields() -> list[str]:
    global _USER_FIELDS
    if _USER_FIELDS is None:
        _USER_FIELDS = [
            f.attname for f in get_user_model()._meta.concrete_fields if f.name != "password"
        ]
    return _USER_FIELDS


class KeyCache:
    """Bounded LRU of verified keys with a time to live (cachetools'
    ``TTLCache``): SHA-256 of the key -> (key id, user id, the user's field
    values, the key's own limits or None). Thread-safe (gthread workers). Sized and timed by
    ``API_KEY_CACHE_SIZE`` and ``API_KEY_CACHE_S``, read when a key is put
    (a change of either starts an empty cache)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shape: tuple[float, int] = (0.0, 0)
        self._entries: TTLCache = TTLCache(maxsize=1, ttl=1, timer=self._now)

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def _now(self) -> float:
        return self.clock()  # looked up at each call: tests move it by hand

    def get(self, digest: str):
        """The cached user for this key hash, as a fresh instance, or None.
        Built as unpickling builds one (no ``__init__``, no ``pre_init`` /
        ``post_init`` signals: half the cost of ``from_db`` here, on every
        API request); the password stays deferred, as ``from_db`` leaves it."""
        with self._lock:
            entry = self._entries.get(digest)
        if entry is None:
            return None
        model = get_user_model()
        user = model.__new__(model)
        user.__dict__.update(zip(_user_fields(), entry[2], strict=True))
        user._state = ModelState()
        user._state.adding = False
        user._state.db = DEFAULT_DB_ALIAS
        if entry[3] is not None:
            setattr(user, KEY_LIMITS_ATTR, entry[3])
        return user

    def put(self, digest: str, *, key_id: int, user, limits: KeyLimits | None = None) -> None:
        ttl, size = settings.API_KEY_CACHE_S, settings.API_KEY_CACHE_SIZE
        if ttl <= 0 or size <= 0:
            return
        values = tuple(getattr(user, name) for name in _user_fields())
        with self._lock:
            if self._shape != (ttl, size):
                self._shape = (ttl, size)
                self._entries = TTLCache(maxsize=size, ttl=ttl, timer=self._now)
            self._entries[digest] = (key_id, user.pk, values, limits)

    def forget_key(self, digest: str) -> None:
        with self._lock:
            self._entries.pop(digest, None)

    def forget_user(self, user_id) -> None:
        with self._lock:
            for digest in [d for d, e in self._entries.items() if e[1] == user_id]:
                self._entries.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def digests(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def snapshot(self) -> list[tuple]:
        """Every entry as stored (for tests: what the cache holds)."""
        with self._lock:
            return [(d, *e) for d, e in self._entries.items()]


key_cache = KeyCache()


def user_for_key(key: str, *, before_lookup: Callable[[], None] | None = None):
    """The active user ``key`` belongs to, or None. ``before_lookup`` runs
    when the key must be looked up (not a verified one in the cache), and
    may refuse the request by raising (a flood of bad keys)."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "cc":
        return None
    digest = _hash(key)
    if settings.API_KEY_CACHE_S > 0:
        user = key_cache.get(digest)
        if user is not None:
            return user
    if before_lookup is not None:
        before_lookup()
    row = (
        ApiKey.objects.select_related("user")
        .filter(prefix=parts[1], revoked_at__isnull=True)
        .first()
    )
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        return None
    if not row.user.is_active:
        return None
    limits = None
    if row.has_own_limits:
        limits = KeyLimits(row.id, row.rate_limit_admissions, row.rate_limit_concurrent_requests)
        setattr(row.user, KEY_LIMITS_ATTR, limits)
    key_cache.put(digest, key_id=row.id, user=row.user, limits=limits)
    return row.user
