"""verify_webhook against the server's own signing code (tickets.delivery,
the standardwebhooks library), and on a real delivery by a real worker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from claimcheck_client.webhooks import sign

from claimcheck_client import Client, WebhookVerificationError, verify_webhook

from .helpers import poll

BODY = json.dumps({"ticket": {"id": "0192-abc", "state": "succeeded", "result": {"x": 1}}})


def test_a_real_signature_verifies(server_signature, webhook_secret):
    headers = server_signature(BODY)
    assert verify_webhook(webhook_secret, headers, BODY.encode()) == json.loads(BODY)
    # Header names are case-insensitive; a str body is the same bytes.
    titled = {k.title(): v for k, v in headers.items()}
    assert verify_webhook(webhook_secret, titled, BODY)["ticket"]["id"] == "0192-abc"


def test_a_tampered_body_or_id_is_refused(server_signature, webhook_secret):
    headers = server_signature(BODY)
    with pytest.raises(WebhookVerificationError, match="no webhook-signature matches"):
        verify_webhook(webhook_secret, headers, BODY.replace('"x": 1', '"x": 2'))
    with pytest.raises(WebhookVerificationError):
        verify_webhook(webhook_secret, {**headers, "webhook-id": "another"}, BODY)
    other = "whsec_" + "QUJD" * 8
    with pytest.raises(WebhookVerificationError):
        verify_webhook(other, headers, BODY)


def test_an_old_or_future_timestamp_is_refused(server_signature, webhook_secret):
    now = datetime.now(UTC)
    old = server_signature(BODY, at=now - timedelta(minutes=10))
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify_webhook(webhook_secret, old, BODY)
    # The signature itself is good: a wider tolerance accepts it.
    assert verify_webhook(webhook_secret, old, BODY, tolerance_s=900)
    future = server_signature(BODY, at=now + timedelta(minutes=10))
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify_webhook(webhook_secret, future, BODY)
    # A timestamp changed to look fresh breaks the signature instead.
    fresh = {**old, "webhook-timestamp": str(int(now.timestamp()))}
    with pytest.raises(WebhookVerificationError, match="no webhook-signature matches"):
        verify_webhook(webhook_secret, fresh, BODY)


def test_any_one_of_several_signatures_may_match(server_signature, webhook_secret):
    headers = server_signature(BODY)
    real = headers["webhook-signature"]
    rotated = sign("whsec_" + "QUJD" * 8, headers["webhook-id"], 1, BODY)
    assert verify_webhook(
        webhook_secret, {**headers, "webhook-signature": f"{rotated} {real}"}, BODY
    )
    only_v2 = {**headers, "webhook-signature": "v2," + real.split(",", 1)[1]}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(webhook_secret, only_v2, BODY)
    missing = {k: v for k, v in headers.items() if k != "webhook-timestamp"}
    with pytest.raises(WebhookVerificationError, match="missing header webhook-timestamp"):
        verify_webhook(webhook_secret, missing, BODY)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_delivery_verifies(
    server, api_key, endpoint, recorder, delivery_worker, webhook_secret
):
    endpoint("hooked")
    receiver = recorder(200)
    with Client(server, api_key) as cc:
        ticket = cc.submit("hooked", {"n": 1}, requester={"webhook_url": f"{receiver.url}/hook"})
        poll(lambda: receiver.bodies("/hook"), timeout=40, message="the webhook delivery")
        _, headers, body = receiver.requests[0]
        payload = verify_webhook(webhook_secret, headers, body)
        assert payload["ticket"]["id"] == ticket.id
        assert payload["ticket"]["result"] == {"echo": {"n": 1}}
        poll(lambda: cc.get(ticket.id).delivery.state == "delivered", message="delivered")
    with pytest.raises(WebhookVerificationError):
        verify_webhook(webhook_secret, headers, body + b" ")
