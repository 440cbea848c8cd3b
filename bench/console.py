"""Does the console stay fast on a large ledger? The ticket list, its search
and filters, and the dashboard, timed at 10,000 tickets and at 1,000,000.

    .venv/bin/python bench/console.py [--small 10000] [--large 1000000] [-r 15] [--keep] [--reuse]

bench/scale.py does the work: the same two databases seeded by SQL
(``claimcheck_bench_console_small`` and ``claimcheck_bench_console`` here),
timed in turn, run by run, the median printed with the growth ratio (1M over
10k; target <= 1.5) with the p95, and, for a figure over it or a search
inside input and result, the slowest SELECT's ``EXPLAIN (ANALYZE, BUFFERS)``.
Only the figures differ: the console's pages as a logged-in staff user
(server time through Django's test ``Client``):

- the dashboard (capped counts, the last hour's per-minute charts and
  failures by code over the primary-key range of the last hour, what awaits
  approval, overdue obligations, recent tickets);
- the ticket list: first page; by state; by delivery (awaiting approval,
  pending); a time range (the last hour);
- search: a full id, the 8-character id end the pages print (``…1234abcd``),
  an id head, a dedupe key, a trace id, and a miss;
- an endpoint page (its last hour of turns, p50/p95);
- search inside input and result (tickets.search): a term matching one
  ticket, 2 % of them, every one, none; two terms; result terms; within the
  hour before the one ticket; 1 % of one endpoint's; as a submitter who sees
  half the ledger (one match, 2 %, and 2 % of the others' tickets, none of
  theirs); and through ``GET /api/v1/tickets?search=``.

The bytes-per-ticket figures of scale.py come along (``--large-results``
small by default here).
"""

from __future__ import annotations

import json
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
    # Inside input and result (tickets.search), newest first, a page of 50.
    "input term, 1 match",
    "input term, 2 % match",
    "input term, every ticket",
    "input term, no match",
    "input terms, 2 % and 1 match",
    "result term, 1 match",
    "result term, every succeeded",
    "input term, 1 match, last hour",
    "input term, every ticket, last hour",
    "input term, 1 %, one endpoint",
    "input term, 1 match, as a submitter",
    "input term, 2 %, as a submitter",
    "input term, 2 % of others', as a submitter",
    "api search, 1 match",
    "api search, 2 % match",
]
SEARCHES = FIGURES[FIGURES.index("input term, 1 match") :]


def figures(ctx: dict) -> dict[str, Callable[[], object]]:
    from datetime import UTC, datetime, timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    console = Client(HTTP_HOST="127.0.0.1")
    console.force_login(ctx["staff"])
    # Half the seeded tickets are bench-user's (scale.py): their own list.
    submitter = Client(HTTP_HOST="127.0.0.1")
    submitter.force_login(get_user_model().objects.get(username="bench-user"))
    api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {ctx['api_key']}")
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
    # The hour before the searched ticket (seeding a million takes longer
    # than an hour: "the last hour" by the clock may hold none of them).
    with connection.cursor() as cur:
        cur.execute("SELECT created_at FROM tickets_ticket WHERE id = %s", [full])
        (created,) = cur.fetchone()
    its_hour = (created - timedelta(minutes=59)).strftime("%Y-%m-%d %H:%M")

    def get(url: str, params=None, *, expect: str | None = None, client=console, check=None):
        def call():
            response = client.get(url, params or {})
            assert response.status_code == 200, (url, params, response.status_code)
            if expect is not None:
                assert expect in response.content.decode(), (url, params, "missing", expect)
            if check is not None:
                check(response)
            return response

        return call

    # The seed's input: {"key": <the dedupe key>, "text": "... team <g % 50> ...",
    # "options": {"tone": "plain", "max_words": 300}}; a succeeded ticket's
    # result is {"echo": <its input>}. One text in 50 is a 2 % match.
    with connection.cursor() as cur:
        cur.execute("SELECT input->>'text' FROM tickets_ticket WHERE id = %s", [full])
        (text,) = cur.fetchone()
        # One of bench-user's own tickets, for the terms of their list; and a
        # text none of theirs has (the seed gives them odd teams only).
        cur.execute(
            "SELECT t.input->>'key', t.input->>'text' FROM tickets_ticket t "
            "JOIN auth_user u ON u.id = t.submitted_by_id WHERE u.username = 'bench-user' "
            "AND t.state = 'succeeded' ORDER BY t.id DESC LIMIT 1 OFFSET 500"
        )
        their_key, their_text = cur.fetchone()
        cur.execute(
            "SELECT t.input->>'text' FROM tickets_ticket t JOIN auth_user u "
            "ON u.id = t.submitted_by_id WHERE u.username <> 'bench-user' "
            "ORDER BY t.id DESC LIMIT 1 OFFSET 500"
        )
        (not_theirs,) = cur.fetchone()
        # A text of the endpoint page's endpoint: a fifth of its tickets.
        cur.execute(
            "SELECT t.input->>'text' FROM tickets_ticket t JOIN endpoints_endpoint e "
            "ON e.id = t.endpoint_id WHERE e.address = %s ORDER BY t.id DESC LIMIT 1 OFFSET 50",
            [ctx["endpoint_address"]],
        )
        (endpoint_text,) = cur.fetchone()
    assert key, "the seed gives every ticket a dedupe key (its input's key)"
    two_pc = "input.text:" + json.dumps(text)
    one = f"input.key:{json.dumps(key)}"

    def page_of_50(response):
        assert len(response.json()["items"]) == 50, "a 2 % match fills a page"

    searches = {
        "input term, 1 match": get("/tickets/", {"q": one}, expect=full),
        "input term, 2 % match": get("/tickets/", {"q": two_pc}, expect="Older"),
        "input term, every ticket": get(
            "/tickets/", {"q": "input.options.tone:plain"}, expect="Older"
        ),
        "input term, no match": get(
            "/tickets/", {"q": "input.key:no-such-key"}, expect="No tickets match."
        ),
        "input terms, 2 % and 1 match": get("/tickets/", {"q": f"{two_pc} {one}"}, expect=full),
        "result term, 1 match": get(
            "/tickets/", {"q": f"result.echo.key:{json.dumps(key)}"}, expect=full
        ),
        "result term, every succeeded": get(
            "/tickets/", {"q": "result.echo.options.max_words:300"}, expect="Older"
        ),
        "input term, 1 match, last hour": get(
            "/tickets/", {"q": one, "since": its_hour}, expect=full
        ),
        "input term, every ticket, last hour": get(
            "/tickets/", {"q": "input.options.tone:plain", "since": its_hour}, expect="Older"
        ),
        "input term, 1 %, one endpoint": get(
            "/tickets/",
            {"q": "input.text:" + json.dumps(endpoint_text), "endpoint": ctx["endpoint_address"]},
            expect="Older",
        ),
        "input term, 1 match, as a submitter": get(
            "/tickets/",
            {"q": f"input.key:{json.dumps(their_key)}"},
            client=submitter,
            expect=their_key,
        ),  # fmt: skip
        "input term, 2 %, as a submitter": get(
            "/tickets/",
            {"q": "input.text:" + json.dumps(their_text)},
            client=submitter,
            expect="Older",
        ),  # fmt: skip
        "input term, 2 % of others', as a submitter": get(
            "/tickets/",
            {"q": "input.text:" + json.dumps(not_theirs)},
            client=submitter,
            expect="No tickets match.",
        ),  # fmt: skip
        "api search, 1 match": get("/api/v1/tickets", {"search": one}, client=api, expect=full),
        "api search, 2 % match": get(
            "/api/v1/tickets", {"search": two_pc}, client=api, check=page_of_50
        ),
    }

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
        **searches,
    }


def main() -> None:
    scale.FIGURES = FIGURES
    scale.figures = figures
    scale.FIRST_PASS = "(none)"
    scale.EXPLAIN_ALWAYS = SEARCHES
    scale.DB_NAME = "claimcheck_bench_console"
    scale.SMALL_DB = "claimcheck_bench_console_small"
    # scale.Child runs scale.py's file: run this one instead.
    scale.__file__ = str(Path(__file__).resolve())
    if "--large-results" not in sys.argv:
        sys.argv += ["--large-results", "100"]
    scale.main()


if __name__ == "__main__":
    main()
