"""The workers page shows one slot row per pool process of a real worker,
in a real browser at 1280 and 390 px: from its start (before any turn), and
after a pool process exits and the pool starts another in its place (what
a "stop the process" does): the new one has its row, the exited one none."""

# ruff: noqa: F811 - the fixtures imported from test_browser are parameters here
from __future__ import annotations

import os
import signal

import pytest
from playwright.sync_api import expect

from console.owners import create_owner
from runtime.models import Worker, WorkerSlot
from tests.conftest import wait_for

from .test_browser import PASSWORD, browser, log_in, page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _pool(main_pid: int) -> set[int]:
    """The worker's pool processes: its children (no beat embedded here)."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == main_pid and fields[0] != "Z":
            children.add(int(entry))
    return children


def _rows_match_the_pool(name: str, main_pid: int) -> set[int] | None:
    pool = _pool(main_pid)
    rows = set(WorkerSlot.objects.filter(worker__name=name).values_list("pid", flat=True))
    return rows if len(pool) == 2 and rows == pool else None


def test_the_workers_page_shows_a_row_per_pool_process(
    celery_procs, page, live_server, django_user_model
):
    celery_procs.worker("turns", queues="turns", concurrency=2)
    worker = wait_for(
        lambda: Worker.objects.filter(name__startswith="turns@").first(),
        timeout=30,
        message="the worker to register",
    )
    # No turn has run: each pool process has its row all the same.
    before = wait_for(
        lambda: _rows_match_the_pool(worker.name, worker.pid),
        timeout=30,
        message="a slot row per pool process",
    )
    # A pool process exits (as a "stop the process" kills it): the pool
    # starts another; the rows follow, with no turn run.
    gone = min(before)
    os.kill(gone, signal.SIGKILL)

    def replaced() -> set[int] | None:
        rows = _rows_match_the_pool(worker.name, worker.pid)
        return rows if rows and gone not in rows else None

    after = wait_for(
        replaced,
        timeout=30,
        message="the replacement's row, and none for the process that exited",
    )
    assert len(after) == 2 and gone not in after

    django_user_model.objects.create_user("sam", is_staff=True)
    create_owner(username="sam", password=PASSWORD, endpoints=[])
    log_in(page, live_server, "/workers/", "sam", PASSWORD)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        rows = page.locator(f'article[data-worker="{worker.name}"] tbody tr[data-slot]')
        expect(rows).to_have_count(2)
        assert {int(p) for p in rows.evaluate_all("(rs) => rs.map((r) => r.dataset.slot)")} == after
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        shot(page, f"workers-{width}")
