"""Does the console stay fast on a large ledger? The ticket list, its search
and filters, and the dashboard, timed at 10,000 tickets and at 1,000,000.

    .venv/bin/python bench/console.py [--small 10000] [--large 1000000] [-r 15] [--keep]

bench/scale.py does the work: the same two databases seeded by SQL
(``claimcheck_bench_console_small`` and ``claimcheck_bench_console`` here),
timed in turn, run by run, the median printed with the growth ratio (1M over
10k; target <= 1.5) and, for a figure over it, the slowest SELECT's
``EXPLAIN (ANALYZE, BUFFERS)``. Only the figures differ: the console's pages
as a logged-in staff user (server time through Django's test ``Client``):

- the dashboard (capped counts, the last hour's per-minute charts and
  failures by code over the primary-key range of the last hour, what awaits
  approval, overdue obligations, recent tickets);
- the ticket list: first page; by state; by delivery (awaiting approval,
  pending); a time range (the last hour);
- search: a full id, the 8-character id end the pages print (``…1234abcd``),
  an id head, a dedupe key, a trace id, and a miss;
- an endpoint page (its last hour of turns, p50/p95).

The bytes-per-ticket figures of scale.py come along (``--large-results``
small by default here).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import scale  # noqa: E402

FIGURES = [
    "dashboard",
    "list, first page",
    "list, state=failed",
    "list, delivery=awaiting_approval",
    "list, delivery=pending",
    "list, last hour",
    "search, full id",
    "search, id end (…8 chars)",
    "search, id head (13 chars)",
    "search, dedupe key",
    "search, trace id",
    "search, no match",
    "endpoint page",
]


def figures(ctx: dict) -> dict[str, Callable[[], object]]:
    from datetime import UTC, datetime, timedelta

    from django.db import connection
    from django.test import Client

    console = Client(HTTP_HOST="127.0.0.1")
    console.force_login(ctx["staff"])
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id::text, dedupe_key, trace_id FROM tickets_ticket "
            "WHERE state = 'succeeded' AND dedupe_key IS NOT NULL AND dedupe_key <> '' "
            "ORDER BY id DESC LIMIT 1 OFFSET 500"
        )
        row = cur.fetchone()
        if row is None:  # a seed without dedupe keys: search by id only
            cur.execute("SELECT id::text, '', trace_id FROM tickets_ticket ORDER BY id DESC "
                        "LIMIT 1 OFFSET 500")  # fmt: skip
            row = cur.fetchone()
    full, key, trace = row
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")

    def get(url: str, params: dict | None = None, *, expect: str | None = None):
        def call():
            response = console.get(url, params or {})
            assert response.status_code == 200, (url, params, response.status_code)
            if expect is not None:
                assert expect in response.content.decode(), (url, params, "missing", expect)
            return response

        return call

    return {
        "dashboard": get("/"),
        "list, first page": get("/tickets/"),
        "list, state=failed": get("/tickets/", {"state": "failed"}),
        "list, delivery=awaiting_approval": get("/tickets/", {"delivery": "awaiting_approval"}),
        "list, delivery=pending": get("/tickets/", {"delivery": "pending"}),
        "list, last hour": get("/tickets/", {"since": hour_ago}),
        "search, full id": get("/tickets/", {"q": full}, expect=full),
        "search, id end (…8 chars)": get("/tickets/", {"q": "…" + full[-8:]}, expect=full),
        "search, id head (13 chars)": get("/tickets/", {"q": full[:13]}, expect=full),
        "search, dedupe key": get("/tickets/", {"q": key or full}, expect=full),
        "search, trace id": get("/tickets/", {"q": trace}),
        "search, no match": get("/tickets/", {"q": "no-such-key-anywhere"}),
        "endpoint page": get(f"/endpoints/{ctx['endpoint_address']}/"),
    }


def main() -> None:
    scale.FIGURES = FIGURES
    scale.figures = figures
    scale.FIRST_PASS = "(none)"
    scale.DB_NAME = "claimcheck_bench_console"
    scale.SMALL_DB = "claimcheck_bench_console_small"
    # scale.Child runs scale.py's file: run this one instead.
    scale.__file__ = str(Path(__file__).resolve())
    if "--large-results" not in sys.argv:
        sys.argv += ["--large-results", "100"]
    scale.main()


if __name__ == "__main__":
    main()
