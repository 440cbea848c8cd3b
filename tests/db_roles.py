"""The test run's two database roles (docs/howto/production.md).

`make test` sets DATABASE_URL to the owner role and DATABASE_APP_ROLE to the
application role. pytest-django creates and migrates the test database as the
owner (migrate's post_migrate grants the application role its privileges);
then every in-process connection and every Celery process started by the
tests connects as the application role, so the suite proves the code runs
with nothing more. Two things still need the owner:

- the flush between transactional tests (``_flush``: a DELETE from every
  table): it runs as the owner in a maintenance session, in a transaction
  that sets ``claimcheck.pruning``, the privileged path past the append-only
  tables' row trigger that retention takes (Django's own flush, for a test
  that asks for it, TRUNCATEs with ``claimcheck.allow_truncate = on``);
- tests that show a trigger refusing the owner itself: ``owner_cursor``.

Without DATABASE_APP_ROLE everything runs as DATABASE_URL's one role.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.test import TransactionTestCase

# The owner's credentials, once the in-process connections use the app role.
OWNER: dict[str, str] = {}
MAINTENANCE_OPTIONS = "-c claimcheck.allow_truncate=on"


def two_roles() -> bool:
    return bool(OWNER)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, created and migrated as the owner;
    from here on in-process code connects as the application role."""
    db = settings.DATABASES["default"]  # the dict every thread's connection reads
    role = settings.DATABASE_APP_ROLE
    if not role or role == db["USER"]:
        yield
        return
    OWNER.update(USER=db["USER"], PASSWORD=db.get("PASSWORD") or "")
    with django_db_blocker.unblock():
        connections.close_all()
    # No password: trust on 127.0.0.1, or libpq's ~/.pgpass, as for the owner.
    db.update(USER=role, PASSWORD="")
    yield
    connections.close_all()
    db.update(OWNER)  # pytest-django drops the test database as its owner
    OWNER.clear()


@contextlib.contextmanager
def owner_session(*, maintenance: bool, alias: str = "default"):
    """This thread's ``alias`` connects as the owner until the block ends; in
    a maintenance session (``claimcheck.allow_truncate = on``) if asked."""
    conn = connections[alias]
    saved = conn.settings_dict
    conn.close()
    options = dict(saved.get("OPTIONS", {}))
    if maintenance:
        options["options"] = MAINTENANCE_OPTIONS
    conn.settings_dict = {**saved, **OWNER, "OPTIONS": options}
    try:
        yield conn
    finally:
        conn.close()
        conn.settings_dict = saved


# What migrate's post_migrate writes and no test changes: kept.
_KEPT = frozenset({"django_content_type", "auth_permission", "django_migrations"})


def _flush(conn) -> None:
    """Empty every table but ``_KEPT`` in one transaction of DELETEs.

    Django's flush TRUNCATEs every table (a new file for each table and
    index) and then sends post_migrate, which writes the content types and
    permissions again, after each of the suite's few hundred transactional
    tests. A test leaves a few rows, and deleting a few rows costs far less
    than a new file for every table and index. The foreign keys are deferred
    (Django's), so the order does not matter; the append-only tables let
    the owner delete in a transaction that sets ``claimcheck.pruning``
    (core/append_only.py), as retention does."""
    tables = [
        table
        for table in conn.introspection.django_table_names(only_existing=True, include_views=False)
        if table not in _KEPT
    ]
    quote = conn.ops.quote_name
    # A worker shared between tests (tests/conftest.py, SharedWorker) runs its
    # sweeps meanwhile: a deadlock with one of them is tried again.
    for attempt in range(3):
        try:
            with transaction.atomic(using=conn.alias), conn.cursor() as cur:
                cur.execute("SELECT pg_catalog.set_config('claimcheck.pruning', 'on', true)")
                cur.execute("; ".join(f"DELETE FROM {quote(table)}" for table in tables))
            return
        except OperationalError as exc:
            if attempt == 2 or not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected):
                raise


def _flush_as_owner(teardown):
    # TransactionTestCase empties every table after each test; the
    # application role may not, so the flush runs in the owner's maintenance
    # session. TestCase overrides this method (it rolls back instead).
    def _fixture_teardown(self):
        # Django's own flush where a test asks for what only it does.
        own = self.available_apps is None and not self.serialized_rollback
        if not OWNER:
            if not own:
                return teardown(self)
            for name in self._databases_names(include_mirrors=False):
                _flush(connections[name])
            return None
        with owner_session(maintenance=True) as conn:
            if not own:
                return teardown(self)
            _flush(conn)
            return None

    _fixture_teardown.flushes_as_owner = True
    return _fixture_teardown


if not getattr(TransactionTestCase._fixture_teardown, "flushes_as_owner", False):
    TransactionTestCase._fixture_teardown = _flush_as_owner(TransactionTestCase._fixture_teardown)


def connect(*, owner: bool, options: str = "") -> psycopg.Connection:
    """A separate autocommit connection to the test database, as the owner
    or as the application role (or the one role without DATABASE_APP_ROLE)."""
    db = connections["default"].settings_dict
    creds = OWNER if owner and OWNER else {"USER": db["USER"], "PASSWORD": db.get("PASSWORD")}
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or None,
        dbname=db["NAME"],
        user=creds["USER"],
        password=creds["PASSWORD"] or None,
        # A test's own open transaction must not hang a TRUNCATE here forever.
        options=f"-c lock_timeout=10s {options}".strip(),
        autocommit=True,
    )


@pytest.fixture
def owner_cursor(django_db_setup):
    """A cursor of the owner role's, outside the test's transaction (use it
    with committed data: ``django_db(transaction=True)``)."""
    with connect(owner=True) as conn, conn.cursor() as cur:
        yield cur
