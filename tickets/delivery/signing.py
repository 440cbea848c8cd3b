"""Signing a webhook (Standard Webhooks) and the retry schedule."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from standardwebhooks.webhooks import Webhook

from core.transient import backoff_delay

log = logging.getLogger(__name__)


def backoff_s(attempt: int) -> float:
    """The wait after the ``attempt``-th send (from 1): full jitter up to
    min(cap, base * 2^(attempt-1)), which spreads the retries of many
    deliveries to one struggling receiver instead of synchronising them."""
    return backoff_delay(
        max(0, attempt - 1),
        base_s=settings.DELIVERY_BACKOFF_BASE_S,
        cap_s=settings.DELIVERY_BACKOFF_CAP_S,
        floor_s=0.0,
    )


def signer() -> Webhook:
    """The Standard Webhooks signer. Its key never appears in a log line, an
    error or the ledger."""
    try:
        return Webhook(settings.DELIVERY_SIGNING_SECRET)
    except Exception:  # binascii.Error and friends would echo nothing useful
        raise ImproperlyConfigured(
            "DELIVERY_SIGNING_SECRET must be 'whsec_' followed by standard base64"
        ) from None


def signed_headers(
    *, webhook: Webhook, delivery_id: uuid.UUID, body: str, at: datetime
) -> dict[str, str]:
    """Standard Webhooks headers: the id is the delivery's (the same on every
    retry, so the receiver can deduplicate); the timestamp is this attempt's;
    the signature is ``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    msg_id = str(delivery_id)
    return {
        "content-type": "application/json",
        "user-agent": "claimcheck-delivery/1",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": webhook.sign(msg_id, at, body),
    }
