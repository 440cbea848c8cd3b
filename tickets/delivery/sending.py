"""Sending one webhook attempt: claim, check the URL again and send
pinned (core/outbound.py), record the answer."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from core import limits, outbound, tracing
from core.errors import Invalid
from core.transient import retry_transient

from ..events import update_fields
from ..models import Delivery, DeliveryAttempt, DeliveryState
from ..selectors import ticket_payload
from .signing import backoff_s, signed_headers, signer
from .states import closed_obligation, locked_ticket

log = logging.getLogger(__name__)

# A claimed attempt owns the delivery until the HTTP timeout plus this margin;
# if its worker dies mid-send, the sweep sends again once the lease runs out.
CLAIM_MARGIN_S = 30.0
MAX_ERROR_CHARS = limits.ERROR_CHARS


@dataclass
class Sent:
    """What one attempt observed."""

    number: int
    status_code: int | None = None
    latency_ms: float | None = None
    error: str = ""
    refused: bool = False  # the URL policy refused the target: nothing was sent

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _claim(delivery_id: uuid.UUID, now: datetime) -> int | None:
    """Take the next attempt of a due delivery; returns its number.

    One conditional UPDATE (row-count checked): of two workers holding the
    same message, one moves ``next_attempt_at`` past ``now`` and the other
    matches nothing. The new ``next_attempt_at`` is a lease, not NULL: if this
    worker dies mid-send, the sweep finds the delivery due again once the
    lease runs out (the lost attempt leaves a gap in the attempt numbers).
    """
    lease = timedelta(seconds=settings.DELIVERY_TIMEOUT_S + CLAIM_MARGIN_S)
    claimed = Delivery.objects.filter(
        id=delivery_id,
        next_attempt_at__lte=now,
        attempts__lt=settings.DELIVERY_MAX_ATTEMPTS,
        delivered_at__isnull=True,
    ).update(next_attempt_at=now + lease, attempts=F("attempts") + 1)
    if not claimed:
        return None
    return Delivery.objects.filter(id=delivery_id).values_list("attempts", flat=True).get()


def send(*, delivery_id: uuid.UUID) -> Sent | None:
    """One webhook attempt, on the worker (DESIGN.md flow 5). Returns what it
    observed, or None when there was nothing to send (not due, claimed by
    another worker, delivered, awaiting approval: a duplicate message).

    1. Claim the attempt with a conditional UPDATE (``_claim``); no row lock
       is held after it.
    2. Outside any transaction: check the URL again and resolve its host
       once (``resolve_target``: DNS may have changed since admission),
       render ``{"ticket": ...}``, sign it, POST it over a connection to
       exactly the checked addresses (``post_pinned``), without following
       redirects (a redirect could point anywhere).
    3. In one transaction (ticket, then delivery, locked): append the
       ``DeliveryAttempt`` and apply the outcome: 2xx -> delivered and the
       obligation closed; 410, a URL the policy now refuses, or the last
       attempt -> failed; anything else (a host that does not resolve
       included) -> attempted, next attempt after a jittered backoff. An
       attempt that is no longer the delivery's latest (its lease ran out
       and another took over) is logged and changes nothing, unless it was
       a 2xx.
    """
    webhook = signer()  # misconfigured: fail before claiming, lose no attempt
    now = timezone.now()
    number = _claim(delivery_id, now)
    if number is None:
        _fail_exhausted(delivery_id, now)
        return None
    delivery = Delivery.objects.select_related("ticket__endpoint", "ticket__turn").get(
        id=delivery_id
    )
    sent = Sent(number=number)
    try:
        target = outbound.resolve_target(delivery.url)
    except outbound.Unresolvable as exc:
        sent.error = f"not sent: {exc.detail}"  # DNS may come back: retried
    except Invalid as exc:
        # Retrying cannot help: the policy refuses this URL (until an
        # operator changes it), so the delivery fails now, not after 8 tries.
        sent.error = f"refused before sending: {exc.detail}"
        sent.refused = True
    else:
        body = json.dumps({"ticket": ticket_payload(delivery.ticket)}, separators=(",", ":"))
        at = datetime.now(UTC)
        headers = signed_headers(webhook=webhook, delivery_id=delivery.id, body=body, at=at)
        headers.update(tracing.delivery_headers(delivery.ticket))  # traceparent; log ids
        started = time.monotonic()
        try:
            resp = outbound.post_pinned(
                url=delivery.url, target=target, body=body.encode(), headers=headers
            )
            sent.status_code = resp.status_code
            if resp.is_redirect:
                location = resp.headers.get("location", "")[:200]
                sent.error = (
                    f"receiver answered {resp.status_code} "
                    f"(a redirect to {location!r}, not followed)"
                )
            elif not sent.ok:
                sent.error = f"receiver answered {resp.status_code}"
        except httpx.HTTPError as exc:
            sent.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        sent.latency_ms = round((time.monotonic() - started) * 1000, 3)
    # The receiver has answered: record that through a database blip (a lost
    # 2xx would mean sending again). A retry after a commit whose reply was
    # lost finds its own attempt row and records nothing twice.
    retry_transient(
        lambda: _record(delivery_id=delivery_id, ticket_id=delivery.ticket_id, sent=sent),
        what=f"record of delivery {delivery_id} attempt {number}",
        max_s=settings.FINISH_RETRY_MAX_S,
    )
    return sent


def _record(*, delivery_id: uuid.UUID, ticket_id: uuid.UUID, sent: Sent) -> None:
    now = timezone.now()
    with transaction.atomic():
        ticket = locked_ticket(ticket_id)
        delivery = Delivery.objects.select_for_update().get(id=delivery_id)
        if DeliveryAttempt.objects.filter(delivery_id=delivery_id, number=sent.number).exists():
            return  # recorded by an earlier try whose reply a database blip lost
        DeliveryAttempt.objects.create(
            delivery_id=delivery_id,
            number=sent.number,
            at=now,
            status_code=sent.status_code,
            latency_ms=sent.latency_ms,
            error=sent.error,
        )
        detail = {
            "delivery": str(delivery_id),
            "attempt": sent.number,
            "status_code": sent.status_code,
        }
        if sent.ok:
            if delivery.delivered_at is not None:
                return  # a concurrent attempt's 2xx recorded it already
            Delivery.objects.filter(id=delivery_id).update(
                delivered_at=now, next_attempt_at=None, last_error=""
            )
            update_fields(
                ticket_id=ticket_id,
                kind="delivered",
                actor="delivery",
                detail=detail,
                delivery_state=DeliveryState.DELIVERED,
                **closed_obligation(ticket),
            )
            log.info("delivery %s delivered on attempt %s", delivery_id, sent.number)
            return
        latest = delivery.attempts == sent.number and delivery.delivered_at is None
        if not latest or ticket.delivery_state not in (
            DeliveryState.PENDING,
            DeliveryState.ATTEMPTED,
        ):
            return  # a superseded attempt: logged above, decides nothing
        detail["error"] = sent.error
        why = _why_final(sent)
        if why:
            Delivery.objects.filter(id=delivery_id).update(
                next_attempt_at=None, last_error=sent.error
            )
            update_fields(
                ticket_id=ticket_id,
                kind="delivery_failed",
                actor="delivery",
                detail={**detail, "why": why},
                delivery_state=DeliveryState.FAILED,
            )
            log.warning(
                "delivery %s failed (%s) after %s attempt(s): %s",
                delivery_id,
                why,
                sent.number,
                sent.error,
            )
            return
        retry_at = now + timedelta(seconds=backoff_s(sent.number))
        Delivery.objects.filter(id=delivery_id).update(
            next_attempt_at=retry_at, last_error=sent.error
        )
        update_fields(
            ticket_id=ticket_id,
            kind="delivery_attempted",
            actor="delivery",
            detail={**detail, "next_attempt_at": retry_at.isoformat()},
            delivery_state=DeliveryState.ATTEMPTED,
        )
        log.info(
            "delivery %s attempt %s failed (%s); next at %s",
            delivery_id,
            sent.number,
            sent.error,
            retry_at.isoformat(),
        )


def _why_final(sent: Sent) -> str | None:
    """Why a failed attempt ends the delivery, or None to retry it."""
    if sent.refused:
        return "refused by the URL policy"
    if sent.status_code == 410:
        return "gone"
    if sent.number >= settings.DELIVERY_MAX_ATTEMPTS:
        return "attempts exhausted"
    return None


def _fail_exhausted(delivery_id: uuid.UUID, now: datetime) -> None:
    """A delivery whose last allowed attempt was claimed but never reported
    (its worker died) and whose lease has run out: it cannot be claimed
    again, so it fails here instead of staying due forever."""
    stuck = (
        Delivery.objects.filter(
            id=delivery_id,
            next_attempt_at__lte=now,
            attempts__gte=settings.DELIVERY_MAX_ATTEMPTS,
            delivered_at__isnull=True,
        )
        .values_list("ticket_id", flat=True)
        .first()
    )
    if stuck is None:
        return
    with transaction.atomic():
        ticket = locked_ticket(stuck)
        if not Delivery.objects.filter(
            id=delivery_id, next_attempt_at__lte=now, delivered_at__isnull=True
        ).update(next_attempt_at=None, last_error="the last attempt never reported"):
            return
        if ticket.delivery_state in (DeliveryState.PENDING, DeliveryState.ATTEMPTED):
            update_fields(
                ticket_id=stuck,
                kind="delivery_failed",
                actor="delivery",
                detail={"delivery": str(delivery_id), "why": "last attempt lost"},
                delivery_state=DeliveryState.FAILED,
            )
