"""What does an idle console page cost when its live regions watch instead
of polling, and how soon does it show a change? (Issue 12: the console's
live regions wake on a notification; console/views/live.py.)

    .venv/bin/python bench/live.py [-n 30] [--tickets 2000] [--reps 20]

Database ``claimcheck_bench_live`` (plus ``BENCH_DB_SUFFIX``), seeded with
``--tickets`` queued tickets; in process, Django's ``Client`` as a staff
user, server time only. The floor is the design it replaces, measured in
the same run: a region refreshed on its timer.

- One refresh of each region (a ticket in flight, the ticket list's first
  page, the dashboard): queries and milliseconds, the median of ``--reps``.
  The timer paid this every 5 s (ticket) or 10 s (list, dashboard).
- One watch cycle that finds nothing changed: queries and milliseconds,
  its wait (``CONSOLE_LIVE_WAIT_S``, shortened to 50 ms here) left out. An
  idle page makes one every 25 s, plus the 60 s safety refresh.
- So, per idle page per minute: requests, queries and server milliseconds,
  polling against watching, and their ratio.
- Change to answer: a watch waits in a thread; the bench commits a ticket
  event (a cancel for a ticket watch, an admission for the ledger's) and
  times commit to the watch's answer, ``-n`` times: p50 and p90, against
  the timer's expected delay (half its period).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from bench import benchlib  # noqa: E402

HX = {"HTTP_HX_REQUEST": "true"}
REGIONS = [  # name, path (format), the timer's period (s), watches one ticket
    ("ticket page", "/tickets/{ticket}/", 5, True),
    ("ticket list", "/tickets/", 10, False),
    ("dashboard", "/", 10, False),
]
WATCH_EVERY_S = 25.0
SAFETY_S = 60.0


def measure(client, path: str, reps: int) -> tuple[int, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, queries = [], []
    for _ in range(reps):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(path, **HX)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
        queries.append(len(captured.captured_queries))
    return int(statistics.median(queries)), statistics.median(times)


def change_to_answer(cookies, ticket: str | None, token: str, change) -> float:
    """Milliseconds from a change's commit to the waiting watch's answer."""
    from django.db import connections
    from django.test import Client

    from tickets import waits

    answered: dict = {}
    query = {"token": token, **({"ticket": ticket} if ticket else {})}

    def watch():
        client = Client(HTTP_HOST="127.0.0.1")
        client.cookies = cookies  # the staff user's session
        answered["body"] = client.get("/live/", query).json()
        answered["at"] = time.perf_counter()
        connections.close_all()

    thread = threading.Thread(target=watch)
    thread.start()
    deadline = time.monotonic() + 10
    while not waits._hub._waiters.get(ticket or waits.ANY):  # subscribed: it waits now
        assert time.monotonic() < deadline, "the watch never waited"
        time.sleep(0.005)
    time.sleep(0.05)  # past its first read
    committed = change()
    thread.join(30)
    assert answered["body"]["changed"], answered
    return (answered["at"] - committed) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=30, help="changes timed per kind of watch")
    parser.add_argument("--tickets", type=int, default=2000, help="queued tickets seeded")
    parser.add_argument("--reps", type=int, default=20, help="refreshes timed per region")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    benchlib.start_wall_clock()
    benchlib.use_database("claimcheck_bench_live")
    benchlib.recreate_database()
    benchlib.setup_django()

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from endpoints.services import create_endpoint
    from runtime.services import cancel_ticket
    from tickets import selectors as ticket_selectors
    from tickets import waits
    from tickets.admission import admit_ticket

    settings.CONSOLE_LIVE_WAIT_S = 0.05
    logging.disable(logging.INFO)  # a login line per request otherwise
    create_endpoint(address="bench.live", runner={"kind": "python", "path": "runtime.demo.echo"})
    tickets = [
        admit_ticket(endpoint="bench.live", input={"n": i}).ticket.id for i in range(args.tickets)
    ]
    staff = get_user_model().objects.create_user("bench", password="pw-bench-1", is_staff=True)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(staff)
    ticket = tickets[-1]

    print(f"bench/live.py: {args.tickets} queued tickets, {args.reps} reps, staff user")
    print(
        f"{'region':<14} {'refresh q':>9} {'ms':>6} {'watch q':>8} {'ms':>6}  "
        f"{'per idle minute: polling q / ms':>32}  {'watching q / ms':>16}  ratio (ms)"
    )
    for name, path, period, one_ticket in REGIONS:
        q_refresh, ms_refresh = measure(client, path.format(ticket=ticket), args.reps)
        if one_ticket:
            watch = f"/live/?ticket={ticket}&token={ticket_selectors.change_token(ticket)}"
        else:
            watch = f"/live/?token={ticket_selectors.ledger_change_token()}"
        q_watch, ms_watch = measure(client, watch, args.reps)
        ms_watch = max(0.0, ms_watch - settings.CONSOLE_LIVE_WAIT_S * 1000)
        polls = 60 / period
        poll_q, poll_ms = polls * q_refresh, polls * ms_refresh
        watch_q = 60 / WATCH_EVERY_S * q_watch + 60 / SAFETY_S * q_refresh
        watch_ms = 60 / WATCH_EVERY_S * ms_watch + 60 / SAFETY_S * ms_refresh
        print(
            f"{name:<14} {q_refresh:>9} {ms_refresh:>6.1f} {q_watch:>8} {ms_watch:>6.1f}  "
            f"{poll_q:>17.0f} / {poll_ms:>6.0f} ms  {watch_q:>7.0f} / {watch_ms:>4.0f} ms"
            f"  {watch_ms / poll_ms:.2f}"
        )

    settings.CONSOLE_LIVE_WAIT_S = 30
    queued = iter(tickets[:-1])

    def cancel(ticket_id):
        def run():
            cancel_ticket(ticket_id=ticket_id, actor="bench", reason="bench")
            return time.perf_counter()

        return run

    def admit():
        admit_ticket(endpoint="bench.live", input={"new": True})
        return time.perf_counter()

    for name, period in [("ticket watch, a cancel", 5), ("ledger watch, an admission", 10)]:
        delays = []
        for _ in range(args.n):
            if period == 5:
                tid = next(queued)
                token = ticket_selectors.change_token(tid)
                delays.append(change_to_answer(client.cookies, str(tid), token, cancel(tid)))
            else:
                token = ticket_selectors.ledger_change_token()
                delays.append(change_to_answer(client.cookies, None, token, admit))
        delays.sort()
        p50, p90 = statistics.median(delays), delays[int(0.9 * (len(delays) - 1))]
        timer = period / 2 * 1000
        print(
            f"change to answer, {name}: p50 {p50:.1f} ms, p90 {p90:.1f} ms over {len(delays)};"
            f" the {period} s timer's expected {timer:.0f} ms: {timer / p50:.0f}x sooner"
        )
    waits.stop_listener()
    if not args.keep:
        from django.db import connections

        connections.close_all()
        benchlib.drop_database()


if __name__ == "__main__":
    main()
