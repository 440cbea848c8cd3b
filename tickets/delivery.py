"""Delivery of a root ticket's answer to its requester (DESIGN.md flow 5).

Done is not delivered: a terminal root ticket gets one ``Delivery`` row (its id
is the stable ``webhook-id``) and a ``delivery_state`` of its own, which never
changes the ticket's work state.

Delivery state edges (``Ticket.delivery_state``)::

    none              -> awaiting_approval | pending   on_root_terminal
    awaiting_approval -> pending                       approve_ticket (an owner)
    pending|attempted -> attempted                     a webhook attempt failed, retry later
    pending|attempted -> delivered                     a 2xx answer, or a pull acknowledgement
    pending|attempted -> failed                        410 Gone, or the attempts ran out
    failed            -> delivered                     a late 2xx from an attempt whose lease
                                                       had run out: the receiver has it

The ``Delivery`` row carries the retry schedule. ``next_attempt_at`` is not
null exactly when a webhook send is owed (or claimed, see ``send``); the sweep
reads it through the partial index ``delivery_due_idx``.

Lock order: ``Ticket`` before ``Delivery``. No lock is held across DNS or HTTP.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from config.dispatch import DELIVER, publish
from config.errors import Forbidden, Invalid, InvalidTransition, NotFound
from endpoints.selectors import is_owner

from .lifecycle import update_fields
from .models import Delivery, DeliveryAttempt, DeliveryState, ObligationState, Ticket
from .selectors import ticket_payload

log = logging.getLogger(__name__)

# A claimed attempt owns the delivery until the HTTP timeout plus this margin;
# if its worker dies mid-send, the sweep sends again once the lease runs out.
CLAIM_MARGIN_S = 30.0
MAX_ERROR_CHARS = 2000
SWEEP_BATCH = 200


# --- URL policy ---------------------------------------------------------------------------


def _host_listed(host: str, allowed: list[str]) -> bool:
    """Exact host (case-insensitive), or ``.example.com`` for a domain and its
    subdomains, as in Django's ALLOWED_HOSTS."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.strip().lower().rstrip(".")
        if not entry:
            continue
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry.strip("[]"):
            return True
    return False


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def validate_webhook_url(url: str) -> None:
    """Refuse a webhook target we must not call; raise ``Invalid`` saying why.

    1. ``http`` or ``https`` with a host (and a valid port).
    2. ``DELIVERY_ALLOWED_HOSTS`` not empty: the host must be listed. A listed
       host is trusted as it is, private or loopback included.
    3. Otherwise the host must resolve, and every address it resolves to must
       be public: no private, loopback, link-local, reserved, multicast or
       unspecified address (a server-side request forgery guard).

    Called at admission and again right before each send (DNS may change).
    """
    if not isinstance(url, str) or not url:
        raise Invalid("webhook_url must be an http(s) URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Invalid("webhook_url is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise Invalid("webhook_url must use http or https")
    host = parts.hostname
    if not host:
        raise Invalid("webhook_url has no host")
    allowed: list[str] = list(settings.DELIVERY_ALLOWED_HOSTS or [])
    if _host_listed(host, allowed):
        return
    if allowed:
        raise Invalid(f"webhook host {host!r} is not in DELIVERY_ALLOWED_HOSTS")
    try:
        infos = socket.getaddrinfo(
            host, port or (443 if parts.scheme == "https" else 80), proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError, OSError):
        raise Invalid(f"webhook host {host!r} does not resolve") from None
    if not infos:
        raise Invalid(f"webhook host {host!r} does not resolve")
    for info in infos:
        address = info[4][0].split("%", 1)[0]  # drop an IPv6 zone id
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise Invalid(f"webhook host {host!r} resolves to an unusable address") from None
        if not _is_public(ip):
            raise Invalid(
                f"webhook host {host!r} resolves to {ip}, which is not a public address; "
                "list the host in DELIVERY_ALLOWED_HOSTS to allow it"
            )


# --- Creation, approval, acknowledgement ------------------------------------------------------


def on_root_terminal(*, ticket: Ticket) -> Delivery:
    """Open the delivery of a root ticket that just became terminal.

    Runs inside the terminal transition's transaction (``lifecycle._on_terminal``),
    which holds the ticket row: no I/O here (no DNS, no HTTP), only rows and an
    after-commit publish. Idempotent: the delivery is one-to-one with the
    ticket, so a second call returns the existing row. The obligation stays
    open: delivery closes it.
    """
    existing = Delivery.objects.filter(ticket_id=ticket.id).first()
    if existing is not None:
        return existing
    now = timezone.now()
    url = (ticket.requester or {}).get("webhook_url") or ""
    mode = Delivery.Mode.WEBHOOK if url else Delivery.Mode.PULL
    gated = ticket.endpoint.requires_approval and ticket.approved_at is None
    state = DeliveryState.AWAITING_APPROVAL if gated else DeliveryState.PENDING
    due = mode == Delivery.Mode.WEBHOOK and state == DeliveryState.PENDING
    # next_attempt_at = now even though we publish at once: if the publish is
    # lost (broker down), the delivery sweep still finds it due.
    # A plain INSERT: the caller holds the ticket's row lock (the terminal
    # transition), so nobody can create it between the check above and here;
    # the one-to-one constraint would refuse a second row anyway.
    delivery = Delivery.objects.create(
        ticket_id=ticket.id,
        mode=mode,
        url=url,
        next_attempt_at=now if due else None,
        created_at=now,
    )
    update_fields(
        ticket_id=ticket.id,
        kind="delivery_opened",
        actor="delivery",
        detail={"delivery": str(delivery.id), "mode": mode, "state": state},
        delivery_state=state,
    )
    if due:
        publish(DELIVER, str(delivery.id))
    return delivery


def _locked_ticket(ticket_id: uuid.UUID) -> Ticket:
    ticket = Ticket.objects.select_for_update().filter(id=ticket_id).first()
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


def approve_ticket(*, ticket_id: uuid.UUID, user) -> Ticket:
    """An owner releases the delivery of a terminal ticket whose endpoint
    requires approval: ``awaiting_approval -> pending`` and, for a webhook,
    the send is published after commit.

    Refused with 403 for anyone but the endpoint's owners (or staff), and with
    409 ``invalid_transition`` for a ticket that is not terminal or whose
    delivery does not await approval (a child, or an endpoint without the
    gate). Approving an already approved ticket is a no-op that returns it
    unchanged, so a retried request is safe; the first approval's actor and
    time stay on record.
    """
    ticket = Ticket.objects.select_related("endpoint").filter(id=ticket_id).first()
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    if not is_owner(user, ticket.endpoint):
        raise Forbidden(f"only an owner of {ticket.endpoint.address} may approve its results")
    with transaction.atomic():
        ticket = _locked_ticket(ticket_id)
        if not ticket.is_terminal:
            raise InvalidTransition(
                f"ticket {ticket_id} is {ticket.state}: only a finished ticket can be approved",
                state=ticket.state,
            )
        if ticket.approved_at is not None:
            return ticket  # already approved: nothing to do
        if ticket.delivery_state != DeliveryState.AWAITING_APPROVAL:
            raise InvalidTransition(
                f"ticket {ticket_id} does not await approval (delivery {ticket.delivery_state})",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        delivery = Delivery.objects.select_for_update().get(ticket_id=ticket_id)
        now = timezone.now()
        update_fields(
            ticket_id=ticket_id,
            kind="approved",
            actor=f"user:{user.username}",
            detail={"delivery": str(delivery.id)},
            approved_at=now,
            approved_by=user,
            delivery_state=DeliveryState.PENDING,
        )
        if delivery.mode == Delivery.Mode.WEBHOOK:
            Delivery.objects.filter(id=delivery.id).update(next_attempt_at=now)
            publish(DELIVER, str(delivery.id))
    return Ticket.objects.get(id=ticket_id)


def _closed_obligation(ticket: Ticket) -> dict[str, Any]:
    """Fields that close the ticket's obligation, if it is still open."""
    if ticket.obligation_state != ObligationState.OPEN:
        return {}
    return {"obligation_state": ObligationState.CLOSED, "obligation_due_at": None}


def acknowledge(*, ticket_id: uuid.UUID, actor: str) -> Ticket:
    """The requester took a pull delivery: ``pending | attempted ->
    delivered``, and the obligation closes. 409 ``invalid_transition`` for a
    ticket with no open pull delivery: not finished (or not a root), awaiting
    approval, a webhook delivery, or already delivered."""
    with transaction.atomic():
        ticket = _locked_ticket(ticket_id)
        delivery = Delivery.objects.select_for_update().filter(ticket_id=ticket_id).first()
        if delivery is None:
            raise InvalidTransition(
                f"ticket {ticket_id} is {ticket.state} and has nothing to deliver "
                "(a delivery opens when a root ticket finishes)",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        if delivery.mode != Delivery.Mode.PULL:
            raise InvalidTransition(
                f"ticket {ticket_id} is delivered by webhook; the receiver's 2xx acknowledges it",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        if ticket.delivery_state not in (DeliveryState.PENDING, DeliveryState.ATTEMPTED):
            raise InvalidTransition(
                f"ticket {ticket_id}'s delivery is {ticket.delivery_state}; only a pending "
                "delivery can be acknowledged",
                state=ticket.state,
                delivery=ticket.delivery_state,
            )
        now = timezone.now()
        Delivery.objects.filter(id=delivery.id).update(delivered_at=now, next_attempt_at=None)
        update_fields(
            ticket_id=ticket_id,
            kind="delivery_acknowledged",
            actor=actor,
            detail={"delivery": str(delivery.id)},
            delivery_state=DeliveryState.DELIVERED,
            **_closed_obligation(ticket),
        )
    return Ticket.objects.get(id=ticket_id)


# --- Webhook sends ------------------------------------------------------------------------------


def backoff_s(attempt: int) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))] (AWS's
    "Exponential Backoff And Jitter"): spreads retries of many deliveries to
    one struggling receiver instead of synchronising them."""
    base = settings.DELIVERY_BACKOFF_BASE_S
    cap = settings.DELIVERY_BACKOFF_CAP_S
    return random.uniform(0, min(cap, base * 2 ** max(0, attempt - 1)))  # noqa: S311


def signer() -> Webhook:
    """The Standard Webhooks signer. Its key never appears in a log line, an
    error or the ledger."""
    try:
        return Webhook(settings.DELIVERY_SIGNING_SECRET)
    except Exception:  # binascii.Error and friends would echo nothing useful
        raise ImproperlyConfigured(
            "DELIVERY_SIGNING_SECRET must be 'whsec_' followed by standard base64"
        ) from None


@dataclass
class Sent:
    """What one attempt observed."""

    number: int
    status_code: int | None = None
    latency_ms: float | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


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
    2. Outside any transaction: check the URL again (DNS may have changed),
       render ``{"ticket": ...}``, sign it, POST it without following
       redirects (a redirect could point anywhere).
    3. In one transaction (ticket, then delivery, locked): append the
       ``DeliveryAttempt`` and apply the outcome: 2xx -> delivered and the
       obligation closed; 410 or the last attempt -> failed; anything else
       -> attempted, next attempt after a jittered backoff. An attempt that
       is no longer the delivery's latest (its lease ran out and another
       took over) is logged and changes nothing, unless it was a 2xx.
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
        validate_webhook_url(delivery.url)
    except Invalid as exc:
        sent.error = f"refused before sending: {exc.detail}"
    else:
        body = json.dumps({"ticket": ticket_payload(delivery.ticket)}, separators=(",", ":"))
        at = datetime.now(UTC)
        headers = signed_headers(webhook=webhook, delivery_id=delivery.id, body=body, at=at)
        started = time.monotonic()
        try:
            resp = httpx.post(
                delivery.url,
                content=body.encode(),
                headers=headers,
                timeout=settings.DELIVERY_TIMEOUT_S,
                follow_redirects=False,
            )
            sent.status_code = resp.status_code
            if not sent.ok:
                sent.error = f"receiver answered {resp.status_code}"
        except httpx.HTTPError as exc:
            sent.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        sent.latency_ms = round((time.monotonic() - started) * 1000, 3)
    _record(delivery_id=delivery_id, ticket_id=delivery.ticket_id, sent=sent)
    return sent


def _record(*, delivery_id: uuid.UUID, ticket_id: uuid.UUID, sent: Sent) -> None:
    now = timezone.now()
    with transaction.atomic():
        ticket = _locked_ticket(ticket_id)
        delivery = Delivery.objects.select_for_update().get(id=delivery_id)
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
                **_closed_obligation(ticket),
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
        if sent.status_code == 410 or sent.number >= settings.DELIVERY_MAX_ATTEMPTS:
            why = "gone" if sent.status_code == 410 else "attempts exhausted"
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
        ticket = _locked_ticket(stuck)
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
