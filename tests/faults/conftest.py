"""Fixtures of the fault suite: one private PostgreSQL and Redis per session
(tests/faults/cluster.py), a fresh database and fresh processes per fault
(tests/faults/stack.py), and the figures each fault measures, printed at the
end of the run and written to ``var/faults/figures.json`` (or
``$FAULTS_FIGURES``) by tests/faults/figures.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from .figures import PROPERTY
from .stack import Cluster, Stack


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    try:
        yield c.up()
    finally:
        c.down()


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory, django_db_blocker):
    """One stack for the module's faults (process start-up is the slow part):
    web, two turns workers, the control worker and beat. Each fault uses
    endpoints of its own; the audit checks the whole ledger every time."""
    s = Stack(cluster, tmp_path_factory.mktemp("stack"), django_db_blocker)
    try:
        yield s.start(turns=(("turns", 2), ("turns-b", 2)), control=2)
    finally:
        s.teardown()


@pytest.fixture(autouse=True)
def _services_up(request, cluster):
    """Whatever a failed fault left stopped is started again for the next."""
    if "stack" in request.fixturenames:
        request.getfixturevalue("stack").ensure_running()
    yield
    if not cluster.pg.is_up():
        cluster.pg.start()
    if not cluster.redis.is_up():
        cluster.redis.start()


@pytest.fixture
def record_figures(request):
    def record(figures: dict) -> None:
        figures["at"] = datetime.now(UTC).isoformat(timespec="seconds")
        request.node.user_properties.append((PROPERTY, json.dumps(figures, sort_keys=True)))
        print("FAULT-FIGURES " + json.dumps(figures, sort_keys=True))

    return record
