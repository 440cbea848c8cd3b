"""Verify a Claimcheck delivery: Standard Webhooks, with hmac only.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the key is
the base64 after ``whsec_`` in the secret; ``webhook-signature`` holds one or
more space-separated ``v1,<base64 HMAC-SHA256>`` (several while a secret is
rotated). The timestamp must be within ``tolerance_s`` of now, which bounds
how long a captured request can be replayed; deduplicate on ``webhook-id``
(the delivery id, the same on every retry) for the rest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from .errors import WebhookVerificationError

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


def _header(headers: Mapping[str, str], name: str) -> str:
    # HTTP header names are case-insensitive; a plain dict may use any case.
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"missing header {name}")


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        raise ValueError("the secret must be 'whsec_' followed by standard base64") from None


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """``v1,<base64>`` for this id, timestamp and body (for tests and senders)."""
    payload = body.encode() if isinstance(body, str) else body
    signed = f"{msg_id}.{timestamp}.".encode() + payload
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery's signature and timestamp; returns the parsed body.

    ``body`` must be the raw request body, byte for byte (not re-serialised
    JSON). Raises ``WebhookVerificationError`` for a missing header, a
    timestamp outside ``tolerance_s``, or no matching ``v1`` signature.
    """
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
    expected = sign(secret, msg_id, timestamp, body).encode()
    # Constant-time comparison: a timing side channel must not reveal how
    # much of a forged signature was right. Other versions are skipped.
    if not any(
        c.startswith("v1,") and hmac.compare_digest(c.encode(), expected)
        for c in signatures.split()
    ):
        raise WebhookVerificationError("no webhook-signature matches")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise WebhookVerificationError("the signed body is not JSON") from None
    if not isinstance(parsed, dict):
        raise WebhookVerificationError("the signed body is not a JSON object")
    return parsed
