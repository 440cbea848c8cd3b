"""API keys: ``cc_<prefix>_<secret>``; only a SHA-256 of the whole key is
stored (the key has 256 bits of entropy, so a slow hash adds nothing)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.contrib.auth import get_user_model

from .models import ApiKey


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(*, username: str, name: str = "", staff: bool = False) -> tuple[ApiKey, str]:
    """Create the user if missing; returns the row and the plain key (shown once)."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    if staff and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    prefix = secrets.token_hex(6)
    key = f"cc_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey.objects.create(user=user, name=name, prefix=prefix, key_hash=_hash(key))
    return row, key


def user_for_key(key: str):
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "cc":
        return None
    row = (
        ApiKey.objects.select_related("user")
        .filter(prefix=parts[1], revoked_at__isnull=True)
        .first()
    )
    if row is None or not hmac.compare_digest(row.key_hash, _hash(key)):
        return None
    if not row.user.is_active:
        return None
    return row.user
