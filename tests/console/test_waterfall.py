"""The trace page's timeline: each ticket's queued, running and waiting
spans on one axis, callbacks and re-runs marked, the callback that
completed the root highlighted; bounded in rows and in queries. Built
in-process through the runtime's and recovery's own steps
(tests/console/test_browser_trace.py draws the same in a browser with a
real worker)."""

from __future__ import annotations

import re

import pytest

from console.selectors import traces
from tickets.admission import admit_ticket
from tickets.models import Ticket, TicketState

from .helpers import run_queued, waiting_family

pytestmark = pytest.mark.django_db


def lane_row(body: str, ticket_id) -> str:
    """The waterfall's table row of one ticket."""
    match = re.search(rf'<tr class="([^"]*)" data-ticket="{ticket_id}">(.*?)</tr>', body, re.S)
    assert match, f"no timeline row for {ticket_id}"
    return match.group(1) + " " + match.group(2)


def test_a_trace_with_a_callback_and_a_rerun_as_a_timeline(client, viewer):
    root, first, second, rerun = waiting_family("wf", "olive")
    run_queued("wf.child", "wf.research")
    root.refresh_from_db()
    assert root.state == TicketState.SUCCEEDED
    completer = Ticket.objects.get(turn_id=root.completed_by_turn_id)
    assert completer.callback_for_id is not None
    other_callbacks = Ticket.objects.filter(callback_for__isnull=False).exclude(id=completer.id)
    assert other_callbacks.count() == 1

    client.force_login(viewer)
    body = client.get(f"/traces/{root.trace_id}/").content.decode()
    timeline = body[body.index('id="waterfall"') : body.index('id="tree"')]
    assert "6 tickets" in timeline  # root, two children, the re-run, two callbacks

    # The root queued, ran (its turn dispatched the children) and waited.
    row = lane_row(timeline, root.id)
    assert 'class="wf-queued"' in row and 'class="wf-running"' in row
    assert 'class="wf-waiting"' in row
    assert re.search(r"waited [\d.]+ (ms|s) from \d\d:\d\d:\d\dZ", row)
    # The quarantined child's turn has no known end; its re-run is marked.
    assert 'class="wf-unknown"' in lane_row(timeline, first.id)
    assert "end unknown" in lane_row(timeline, first.id)
    rerun_row = lane_row(timeline, rerun.id)
    assert rerun_row.startswith("wf-re-run") and f'title="{first.id}"' in rerun_row
    # The callback whose turn completed the root, and only that one, highlighted.
    assert lane_row(timeline, completer.id).startswith("wf-callback wf-completing")
    assert "completed the root" in lane_row(timeline, completer.id)
    assert timeline.count("wf-completing") == 1
    assert "completed the root" not in lane_row(timeline, other_callbacks.get().id)
    # Figures in the table, and on the axis the trace's start in UTC.
    assert re.search(r'<td class="num">[\d.]+ (ms|s)</td>', lane_row(timeline, second.id))
    assert re.search(r"\d\d:\d\d:\d\dZ</span>", timeline)


def test_a_ticket_in_flight_is_drawn_to_now(client, viewer, echo):
    queued = admit_ticket(endpoint=echo.address, input={"n": 1}).ticket
    client.force_login(viewer)
    row = lane_row(client.get(f"/traces/{queued.trace_id}/").content.decode(), queued.id)
    assert 'class="wf-queued wf-open"' in row and "so far" in row
    assert "wf-running" not in row


def test_the_waterfall_caps_its_rows_and_says_how_many_are_hidden(
    client, viewer, echo, monkeypatch
):
    monkeypatch.setattr(traces, "WATERFALL_CAP", 4)
    root = admit_ticket(endpoint=echo.address, input={"root": True}).ticket
    for n in range(6):
        admit_ticket(endpoint=echo.address, input={"n": n}, parent_id=root.id)
    client.force_login(viewer)
    body = client.get(f"/traces/{root.trace_id}/").content.decode()
    timeline = body[body.index('id="waterfall"') : body.index('id="tree"')]
    assert timeline.count("data-ticket=") == 4
    assert "3 more tickets not drawn" in timeline
    # The lineage table still lists every one.
    assert body[body.index('id="tree"') :].count('class="branch"') == 6


def test_the_completing_callback_is_drawn_even_past_the_cap(viewer):
    root, *_ = waiting_family("wfc", "olive")
    run_queued("wfc.child", "wfc.research")
    root.refresh_from_db()
    completer = Ticket.objects.get(turn_id=root.completed_by_turn_id)
    _, rows = traces.trace_tree(root.trace_id, user=viewer)
    drawn = traces.trace_waterfall(rows, cap=2)
    assert [w.row.ticket.id for w in drawn["rows"]] == [root.id, completer.id]
    assert drawn["rows"][1].completes_root and drawn["hidden"] == 4


def test_the_trace_page_reads_a_bounded_number_of_queries(
    client, viewer, echo, django_assert_max_num_queries
):
    def trace_of(n: int) -> str:
        root = admit_ticket(endpoint=echo.address, input={"n": n, "root": True}).ticket
        for i in range(n):
            child = admit_ticket(endpoint=echo.address, input={"n": n, "i": i}, parent_id=root.id)
            if i % 2:
                run_queued(echo.address)  # some ran: turns to draw
            del child
        return f"/traces/{root.trace_id}/"

    small, large = trace_of(2), trace_of(40)
    client.force_login(viewer)
    # Session and user, the live token, the anchor, the lineage, the
    # tickets with their turns, their cases, their events, the trace's budget.
    with django_assert_max_num_queries(10) as small_queries:
        assert client.get(small).status_code == 200
    with django_assert_max_num_queries(len(small_queries.captured_queries)):
        assert client.get(large).status_code == 200
