"""Failed authentications are counted per client address
(``RATE_LIMIT_FAILED_AUTH``, core/fairshare.py): past the limit, an address's
requests with a key this process has not verified are 429 ``rate_limited``
before any key is looked up, on the API and on /mcp alike, while a key from
another address is served as usual. Random keys all differ, so counting per
key (as the edge once did) would never refuse any of them."""

from __future__ import annotations

import json
import secrets

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.keys import create_api_key, key_cache
from core import fairshare

LIMIT = 5


@pytest.fixture
def failed_auth(settings):
    settings.RATE_LIMIT_FAILED_AUTH = f"{LIMIT}/minute"
    fairshare.storage().reset()
    fairshare._State.down_until = 0.0
    key_cache.clear()
    yield settings
    fairshare.storage().reset()


def random_key() -> str:
    return f"cc_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"


def get(key: str, address: str, path: str = "/api/v1/endpoints"):
    return Client(REMOTE_ADDR=address).get(path, HTTP_AUTHORIZATION=f"Bearer {key}")


def mcp(key: str, address: str):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return Client(REMOTE_ADDR=address).post(
        "/mcp",
        json.dumps(body),
        content_type="application/json",
        HTTP_ACCEPT="application/json, text/event-stream",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def key_lookups(queries) -> int:
    return sum("accounts_apikey" in q["sql"] for q in queries)


@pytest.mark.django_db
def test_random_bad_keys_from_one_address_are_refused_before_any_lookup(failed_auth):
    good = create_api_key(username="goodie")[1]
    first = [get(random_key(), "203.0.113.7").status_code for _ in range(LIMIT)]
    assert first == [401] * LIMIT
    with CaptureQueriesContext(connection) as queries:
        refused = [get(random_key(), "203.0.113.7") for _ in range(20)]
        refused.append(mcp(random_key(), "203.0.113.7"))
    assert {r.status_code for r in refused} == {429}
    body = refused[0].json()
    assert body["error"] == "rate_limited" and "RATE_LIMIT_FAILED_AUTH" in body["detail"]
    assert refused[0]["Retry-After"] and refused[-1].json()["error"] == "rate_limited"
    assert key_lookups(queries.captured_queries) == 0  # never reached the key table
    # Another address: a good key is served, a bad one is a plain 401.
    assert get(good, "198.51.100.2").status_code == 200
    assert mcp(good, "198.51.100.2").status_code == 200
    assert get(random_key(), "198.51.100.2").status_code == 401


@pytest.mark.django_db
def test_a_key_this_process_verified_is_served_from_a_refused_address(failed_auth):
    """An address shared by many (a NAT) keeps its known callers: a key
    already verified is answered from the cache, which costs no lookup."""
    good = create_api_key(username="natted")[1]
    assert get(good, "203.0.113.9").status_code == 200
    for _ in range(LIMIT):
        get(random_key(), "203.0.113.9")
    assert get(random_key(), "203.0.113.9").status_code == 429
    assert get(good, "203.0.113.9").status_code == 200


@pytest.mark.django_db
def test_behind_a_proxy_the_forwarded_address_is_counted(failed_auth):
    failed_auth.LOGIN_PROXY_COUNT = 1

    def via_proxy(client_address: str):
        return Client(REMOTE_ADDR="127.0.0.1").get(
            "/api/v1/endpoints",
            HTTP_AUTHORIZATION=f"Bearer {random_key()}",
            HTTP_X_FORWARDED_FOR=client_address,
        )

    assert [via_proxy("203.0.113.20").status_code for _ in range(LIMIT + 1)][-1] == 429
    assert via_proxy("203.0.113.21").status_code == 401  # the proxy itself is not refused
