"""API keys and the cache of verified keys (accounts/keys.py): revocation and
deactivation take effect at once in the process that made them and within
API_KEY_CACHE_S elsewhere; the cache is keyed by the key's hash, holds no
plaintext key and stays within its size."""

from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command

from accounts.keys import KeyCache, create_api_key, key_cache, revoke_api_key, user_for_key
from accounts.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch, settings):
    """The cache's clock, moved by hand (no sleeping)."""
    settings.API_KEY_CACHE_S = 10
    now = [1000.0]
    monkeypatch.setattr(KeyCache, "clock", staticmethod(lambda: now[0]))

    def advance(seconds: float) -> None:
        now[0] += seconds

    return advance


@pytest.fixture
def alice(api):
    row, key = create_api_key(username="alice")
    return row, api.as_key(key)


def test_a_key_revoked_through_the_app_stops_at_once(alice, clock):
    row, client = alice
    assert client.get("/tickets").status_code == 200
    assert len(key_cache) == 1
    assert revoke_api_key(row.prefix)
    assert client.get("/tickets").status_code == 401
    assert not revoke_api_key(row.prefix)  # conditional: revoked once


def test_the_revoke_command_revokes(alice, clock, capsys):
    row, client = alice
    assert client.get("/tickets").status_code == 200
    call_command("revoke_api_key", row.prefix)
    assert "revoked" in capsys.readouterr().out
    assert client.get("/tickets").status_code == 401


def test_a_key_revoked_elsewhere_stops_within_the_ttl(alice, clock):
    row, client = alice
    assert client.get("/tickets").status_code == 200
    # Another process revokes it: this process hears nothing (a bare UPDATE).
    ApiKey.objects.filter(id=row.id).update(revoked_at="2026-01-01T00:00:00Z")
    clock(9)
    assert client.get("/tickets").status_code == 200  # still cached: the documented delay
    clock(1.5)
    assert client.get("/tickets").status_code == 401


def test_a_deactivated_users_key_stops(alice, clock, django_user_model):
    row, client = alice
    assert client.get("/tickets").status_code == 200
    user = django_user_model.objects.get(username="alice")
    user.is_active = False
    user.save()  # through the app (e.g. the admin): at once
    assert client.get("/tickets").status_code == 401
    # Reactivated, then deactivated elsewhere: within the TTL.
    django_user_model.objects.filter(id=user.id).update(is_active=True)
    assert client.get("/tickets").status_code == 200
    django_user_model.objects.filter(id=user.id).update(is_active=False)
    clock(11)
    assert client.get("/tickets").status_code == 401


def test_the_cache_holds_no_plaintext_key(alice, clock):
    row, client = alice
    key = client.key
    assert client.get("/tickets").status_code == 200
    held = repr(key_cache.snapshot())
    secret = key.split("_", 2)[2]
    assert key not in held and secret not in held
    assert key_cache.digests() == [hashlib.sha256(key.encode()).hexdigest()]
    # Nor the user's password hash.
    assert "pbkdf2" not in held and "argon2" not in held


def test_a_cached_key_costs_no_query_and_gives_a_fresh_user(
    alice, clock, django_assert_num_queries
):
    key = alice[1].key
    first = user_for_key(key)
    first._claimcheck_owned_endpoints = [1]  # a per-request memo must not travel
    with django_assert_num_queries(0):
        second = user_for_key(key)
    assert second is not first and second.pk == first.pk and second.username == "alice"
    assert not hasattr(second, "_claimcheck_owned_endpoints")
    assert second.is_authenticated and second.is_active
    # Built without __init__: still the row, field for field, as the ORM
    # loads it (saved, on its database), the password deferred until asked.
    row = type(second).objects.get(pk=second.pk)
    fields = [f.attname for f in row._meta.concrete_fields if f.name != "password"]
    assert [getattr(second, f) for f in fields] == [getattr(row, f) for f in fields]
    assert second._state.adding is False and second._state.db == "default"
    assert second.get_deferred_fields() == {"password"}
    assert second.password == row.password


def test_the_cache_is_bounded_least_recently_used_first(api, clock, settings):
    settings.API_KEY_CACHE_SIZE = 3
    keys = [create_api_key(username=f"u{i}")[1] for i in range(5)]
    for key in keys[:3]:
        assert user_for_key(key) is not None
    user_for_key(keys[0])  # used again: the most recent
    for key in keys[3:]:
        assert user_for_key(key) is not None
    assert len(key_cache) == 3
    digest = {hashlib.sha256(k.encode()).hexdigest(): k for k in keys}
    assert sorted(digest[d] for d in key_cache.digests()) == sorted([keys[0], keys[3], keys[4]])


def test_ttl_zero_turns_the_cache_off(alice, settings, django_assert_num_queries):
    settings.API_KEY_CACHE_S = 0
    key = alice[1].key
    assert user_for_key(key) is not None
    with django_assert_num_queries(1):
        assert user_for_key(key) is not None
    assert len(key_cache) == 0


def test_a_wrong_key_is_never_cached(alice, clock):
    row, client = alice
    assert client.as_key(f"cc_{row.prefix}_not-the-secret").get("/tickets").status_code == 401
    assert user_for_key(f"cc_{row.prefix}_not-the-secret") is None
    assert len(key_cache) == 0
