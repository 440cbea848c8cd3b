"""/healthz, /readyz and the sweep-run records behind them; the dashboard's
readiness panel (issue 9, finding 7: nothing reported a missing sweeper)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from console.owners import create_owner
from core.sweeps import SWEEP_TASKS
from health.models import SweepRun
from health.services import record_sweep
from runtime import tasks as endpoint_tasks
from runtime import turns as runtime
from tickets import tasks as ticket_tasks

pytestmark = pytest.mark.django_db

SWEEPS = sorted(SWEEP_TASKS)


def all_swept():
    for name in SWEEPS:
        record_sweep(name=name)


def test_healthz_answers_without_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"ok": True}


def test_readyz_names_every_sweep_that_never_ran(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert sorted(body["failed"]) == [f"sweep:{n}" for n in SWEEPS]
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    budgets = body["checks"]["sweep:budgets"]
    assert budgets["last_finished_at"] is None and "beat" in budgets["detail"]


def test_readyz_is_200_when_every_sweep_ran_recently(client):
    all_swept()
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["ready"] is True and response.json()["failed"] == []


def test_a_sweep_that_stopped_running_is_named_with_its_age(client, settings):
    all_swept()
    stale = timezone.now() - timedelta(seconds=3 * settings.SWEEP_INTERVAL_S + 5)
    SweepRun.objects.filter(name="budgets").update(last_finished_at=stale)
    body = client.get("/readyz").json()
    assert body["failed"] == ["sweep:budgets"]
    check = body["checks"]["sweep:budgets"]
    assert check["age_s"] > check["max_age_s"] == 3 * settings.SWEEP_INTERVAL_S


def test_an_unreachable_broker_is_named_and_nothing_sensitive_shown(client, settings):
    all_swept()
    settings.CELERY_BROKER_URL = "redis://:s3cret@127.0.0.1:1/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]
    text = response.content.decode()
    assert "s3cret" not in text and "127.0.0.1" not in text and "redis://" not in text


def test_recording_a_sweep_writes_at_most_twice_per_period(django_assert_num_queries):
    record_sweep(name="budgets")
    first = SweepRun.objects.get(name="budgets").last_finished_at
    # Fresh: the conditional UPDATE matches nothing and the insert is ignored.
    record_sweep(name="budgets")
    assert SweepRun.objects.get(name="budgets").last_finished_at == first
    SweepRun.objects.filter(name="budgets").update(last_finished_at=first - timedelta(hours=1))
    with django_assert_num_queries(1):  # stale: one UPDATE
        record_sweep(name="budgets")
    assert SweepRun.objects.get(name="budgets").last_finished_at > first


@pytest.mark.parametrize(
    "task, name",
    [
        (endpoint_tasks.sweep_budgets, "budgets"),
        (endpoint_tasks.sweep_lost_dispatches, "lost_dispatches"),
        (ticket_tasks.sweep_deliveries, "deliveries"),
        (ticket_tasks.sweep_obligations, "obligations"),
    ],
)
def test_each_sweep_task_records_its_run(task, name):
    task()
    assert SweepRun.objects.filter(name=name).exists()


def test_a_sweep_task_during_an_outage_logs_one_warning_and_records_nothing(monkeypatch, caplog):
    def down():
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(runtime, "sweep_budgets", down)
    with caplog.at_level(logging.WARNING, logger="health.services"):
        endpoint_tasks.sweep_budgets()  # does not raise: the worker goes on
    assert not SweepRun.objects.filter(name="budgets").exists()
    [warning] = [r for r in caplog.records if r.name == "health.services"]
    assert "sweep budgets skipped" in warning.getMessage()


def test_the_dashboard_warns_when_a_sweeper_is_not_running(client):
    client.force_login(create_owner(username="olive", password="pw-olive-1", endpoints=[]))
    page = client.get("/").content.decode()
    assert "Sweeper not running" in page and "celery -A config beat" in page
    assert "sweep:budgets" in page
    all_swept()
    page = client.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert "Sweeper not running" not in page and "Readiness" in page
