"""The delivery sweep: re-publish every delivery whose attempt is due."""

from __future__ import annotations

import logging
import uuid

from django.utils import timezone

from core.dispatch import DELIVER, publish

from ..models import Delivery

log = logging.getLogger(__name__)

SWEEP_BATCH = 200


def sweep_due_deliveries(*, limit: int = SWEEP_BATCH) -> list[uuid.UUID]:
    """Publish a send for every delivery whose next attempt is due (retries,
    lost publishes, attempts whose worker died). Reads the partial index
    ``delivery_due_idx``; the claim in ``send`` makes a duplicate message a
    no-op, so publishing a delivery that is also in flight is harmless."""
    now = timezone.now()
    due = list(
        Delivery.objects.filter(next_attempt_at__isnull=False, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )
    for delivery_id in due:
        publish(DELIVER, str(delivery_id))
    return due
