"""The connection settings a pooled deployment needs
(docs/howto/pgbouncer.md): where the LISTEN sessions connect, and Django's own pool for the
web, which Celery processes drop before they fork."""

from __future__ import annotations

import runpy

from config.celery import drop_connection_pool
from core import listen
from tests.conftest import ROOT


def _databases(monkeypatch, **env: str) -> dict:
    """config/settings.py's DATABASES under ``env`` (evaluated afresh)."""
    monkeypatch.setenv("DATABASE_URL", "postgres://app@db.internal:6432/ledger")
    for name in ("DATABASE_POOL_MAX", "DATABASE_POOL_MIN", "DATABASE_POOL_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "config" / "settings.py"))["DATABASES"]["default"]


def test_the_pool_is_the_webs_and_celery_drops_it(monkeypatch):
    db = _databases(
        monkeypatch,
        DATABASE_POOL_MAX="6",
        DATABASE_POOL_MIN="2",
        DATABASE_POOL_TIMEOUT_S="3",
        DB_CONN_MAX_AGE="60",
    )
    # Django refuses a pool beside persistent connections: CONN_MAX_AGE is 0.
    assert db["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 6, "timeout": 3.0}
    assert db["CONN_MAX_AGE"] == 0
    drop_connection_pool(db, 60)  # what a Celery process does at start
    assert "pool" not in db["OPTIONS"] and db["CONN_MAX_AGE"] == 60

    plain = _databases(monkeypatch, DB_CONN_MAX_AGE="60")
    assert "pool" not in plain["OPTIONS"] and plain["CONN_MAX_AGE"] == 60
    drop_connection_pool(plain, 5)
    assert plain["CONN_MAX_AGE"] == 60  # nothing to drop, nothing changed


def test_listeners_connect_to_the_listen_url_when_set(settings):
    settings.DATABASE_LISTEN_URL = ""
    params = listen.listen_params("claimcheck waits")
    assert params["application_name"] == "claimcheck waits"
    assert listen.describe_target() == "DATABASE_URL"

    settings.DATABASE_LISTEN_URL = (
        "postgres://listener:s3cret@db.direct:5433/ledger?sslmode=require"
    )
    direct = listen.listen_params("claimcheck dispatcher")
    assert {k: direct[k] for k in ("host", "port", "dbname", "user", "password", "sslmode")} == {
        "host": "db.direct",
        "port": 5433,
        "dbname": "ledger",
        "user": "listener",
        "password": "s3cret",
        "sslmode": "require",
    }
    assert direct["application_name"] == "claimcheck dispatcher"
    # The rest of the connection settings carry over (the connect timeout).
    assert direct["connect_timeout"] == params["connect_timeout"]
    assert "s3cret" not in listen.describe_target()
