"""What one ``POST /api/v1/tickets`` costs in round trips, pinned: every
statement the request sends to PostgreSQL, every wake it queues for after
its commit, and with the fair-share limits on, every command it sends to
Redis. A new query or an extra transaction on the hottest route must be a
decision that changes these numbers, not something that slips in
(docs/explanation/scale.md, "What a POST /api/v1/tickets sends").

Counted by an execute wrapper on the request's connection, not
``CaptureQueriesContext``: Django's ``request_started`` resets the query
log that context slices."""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection

from core import fairshare

pytestmark = pytest.mark.django_db


@contextlib.contextmanager
def statements():
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def _post(api, key: str):
    return api.post("/tickets", {"endpoint": "alpha", "input": {"k": key}, "dedupe_key": key})


def test_a_new_ticket_is_one_statement_and_one_wake(
    api, make_endpoint, django_capture_on_commit_callbacks
):
    """A key already verified in this process: the admission function's one
    call is all the request asks of PostgreSQL (no key lookup, no
    transaction, no savepoint, no read-back), and the dispatcher's wake is
    the one thing queued for after the commit."""
    make_endpoint("alpha")
    assert _post(api, "warm").status_code == 201  # the key is verified and cached
    with (
        statements() as sent,
        django_capture_on_commit_callbacks(execute=False) as after_commit,
    ):
        resp = _post(api, "new")
    assert resp.status_code == 201, resp.content
    assert len(sent) == 1, sent
    assert sent[0].startswith("SELECT * FROM claimcheck_admit_v2(")
    assert len(after_commit) == 1  # core/wakes.py: the dispatcher's NOTIFY


def test_a_duplicate_is_one_statement_and_wakes_no_one(
    api, make_endpoint, django_capture_on_commit_callbacks
):
    make_endpoint("alpha")
    assert _post(api, "dup").status_code == 201
    with (
        statements() as sent,
        django_capture_on_commit_callbacks(execute=False) as after_commit,
    ):
        resp = _post(api, "dup")
    assert resp.status_code == 200 and resp.json()["duplicate"] is True, resp.content
    assert len(sent) == 1, sent
    assert sent[0].startswith("SELECT * FROM claimcheck_admit_v2(")
    assert after_commit == []


def test_a_key_not_yet_verified_here_costs_one_lookup_more(api, make_endpoint):
    """The first request of a key in a process looks it up (accounts/keys.py);
    the next ones, within ``API_KEY_CACHE_S``, do not."""
    make_endpoint("alpha")
    with statements() as first:
        assert _post(api, "first").status_code == 201
    with statements() as second:
        assert _post(api, "second").status_code == 201
    assert len(first) == 2 and "accounts_apikey" in first[0], first
    assert len(second) == 1, second


@pytest.fixture
def redis_commands(settings, monkeypatch):
    """The fair-share limits on, in the test Redis; every command sent to it
    counted."""
    settings.RATE_LIMIT_ADMISSIONS = "200/second"  # the default: one window
    settings.RATE_LIMIT_CONCURRENT_REQUESTS = 8
    store = fairshare.storage()
    store.reset()
    fairshare._State.down_until = 0.0
    client = store.storage
    sent: list[str] = []
    real = client.execute_command

    def counted(*args, **options):
        sent.append(str(args[0]))
        return real(*args, **options)

    monkeypatch.setattr(client, "execute_command", counted)
    yield sent
    fairshare._State.down_until = 0.0


def test_fair_share_costs_three_redis_commands_per_admission(api, make_endpoint, redis_commands):
    """With the limits on: the request's lease taken (one script) and
    released (ZREM), and the admission counted in its window (one script a
    window of ``RATE_LIMIT_ADMISSIONS``). The database's count is unchanged."""
    make_endpoint("alpha")
    assert _post(api, "warm").status_code == 201
    redis_commands.clear()
    with statements() as sent:
        assert _post(api, "metered").status_code == 201
    assert len(sent) == 1, sent
    assert sorted(redis_commands) == ["EVAL", "EVALSHA", "ZREM"], redis_commands
