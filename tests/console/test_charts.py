"""Charts that read: the dashboard's range selector, legend, axis ticks and
the same figures as a table; an endpoint's p50/p95 only of turns that ended
on evidence, and no "ended" time for a turn whose end nobody knows."""

from __future__ import annotations

import re

import pytest

from console.owners import create_owner
from console.selectors import charts
from recovery import services as recovery
from runtime import turns as runtime
from tickets.admission import admit_ticket

from .helpers import echo_endpoint, quarantined_case

pytestmark = pytest.mark.django_db


def test_the_dashboard_chart_has_a_range_a_legend_ticks_and_a_table(client, viewer):
    echo_endpoint("chart.echo")
    for n in range(3):
        runtime.run_ticket(ticket_id=admit_ticket(endpoint="chart.echo", input={"n": n}).ticket.id)
    client.force_login(viewer)
    for span, rows in (("1h", 60), ("24h", 24), ("7d", 28)):
        body = client.get("/", {"range": span}).content.decode()
        chart = body[body.index('id="throughput"') :]
        chart = chart[: chart.index("</section>")]
        assert f'data-range="{span}"' in chart
        assert re.search(rf'<a href="\?range={span}" aria-current="true"', chart)
        assert "admitted" in chart and "finished" in chart and 'class="legend"' in chart
        assert chart.count('class="tick"') >= 5  # y ticks, time ticks, "now"
        table = chart[chart.index("<tbody>") : chart.index("</tbody>")]
        assert table.count("<tr>") == rows
    data = charts.last_hour(user=viewer, span="24h")
    assert (data["admitted"], data["finished"]) == (3, 3)
    # Any other value is the default range; the live region keeps the range.
    assert 'data-range="1h"' in client.get("/", {"range": "1y"}).content.decode()
    assert 'hx-get="/?range=7d"' in client.get("/", {"range": "7d"}).content.decode()


def test_the_endpoint_page_has_the_same_chart_for_its_own_tickets(client, viewer):
    echo_endpoint("chart.echo")
    echo_endpoint("chart.other")
    for n in range(3):
        runtime.run_ticket(ticket_id=admit_ticket(endpoint="chart.echo", input={"n": n}).ticket.id)
    admit_ticket(endpoint="chart.other", input={"elsewhere": 1})
    client.force_login(viewer)
    for span, rows, title in (
        ("1h", 60, "in the last hour"),
        ("24h", 24, "in the last 24 hours"),
        ("7d", 28, "in the last 7 days"),
    ):
        body = client.get("/endpoints/chart.echo/", {"range": span}).content.decode()
        chart = body[body.index('id="throughput"') :]
        chart = chart[: chart.index("</section>")]
        assert f'data-range="{span}"' in chart and 'class="legend"' in chart
        assert re.search(rf'<a href="\?range={span}" aria-current="true"', chart)
        assert "3 admitted, 3 of them finished" in chart  # not the other endpoint's
        assert chart[chart.index("<tbody>") :].count("<tr>") == rows
        # The turns by outcome follow the range, and so does the live region.
        assert f"Turns {title}" in body
        if span != "1h":
            assert f'hx-get="/endpoints/chart.echo/?range={span}"' in body


def test_an_unresolved_turn_has_no_end_and_no_place_in_the_percentiles(client):
    case = quarantined_case("chart.stuck")
    owner = create_owner(username="olive", password="pw-olive-1", endpoints=["chart.stuck"])
    inspection = recovery.inspect_case(case_id=case.id, user=owner)
    recovery.decide(
        case_id=case.id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="no evidence; orphan it",
    )
    done = admit_ticket(endpoint="chart.stuck", input={"q": 1}).ticket
    runtime.run_ticket(ticket_id=done.id)
    hour = charts.endpoint_hour(case.endpoint)
    assert (hour["total"], hour["measured"]) == (2, 1)
    client.force_login(owner)
    page = client.get("/endpoints/chart.stuck/").content.decode()
    assert "ended on evidence" in page and "1 of 2 turns" in page
    assert "unknown (closed by a decision)" in page
    ticket_page = client.get(f"/tickets/{case.ticket_id}/").content.decode()
    assert "unknown (closed by a decision)" in ticket_page


def test_a_failed_tickets_obligation_does_not_say_its_result_is_ready(client):
    from console.selectors.obligations import requester_lacks  # noqa: PLC0415
    from endpoints.services import create_endpoint  # noqa: PLC0415
    from tickets.selectors import get_ticket  # noqa: PLC0415

    create_endpoint(address="chart.fail", runner={"kind": "python", "path": "runtime.demo.fail"})
    ticket = admit_ticket(endpoint="chart.fail", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    says = requester_lacks(get_ticket(ticket.id))
    assert "failed without a result" in says and "nothing owed" not in says
