"""Every status a route answers is one its OpenAPI operation declares
(config/openapi.py): each refusal the retry route documents in docs/reference/api.md
(it admits a ticket, so admission's 423 and 429 too) is provoked for real
and compared with the document."""

from __future__ import annotations

import pytest

from accounts.keys import create_api_key
from tests.recovery.conftest import drive_to_quarantine, owner, stuck_endpoint  # noqa: F401
from tickets.admission import admit_ticket

pytestmark = pytest.mark.django_db

RETRY = "/api/v1/tickets/{ticket_id}/retry"


@pytest.fixture
def declared(client):
    schema = client.get("/api/v1/openapi.json").json()

    def of(path: str, method: str = "post") -> set[int]:
        return {int(s) for s in schema["paths"][path][method]["responses"]}

    return of


def test_every_status_the_retry_route_answers_is_declared(
    api,
    make_endpoint,
    declared,
    settings,
    stuck_endpoint,  # noqa: F811 - the fixture
):
    answered: dict[int, str] = {}

    def retry(ticket_id, body=None, client=api):
        resp = client.post(f"/tickets/{ticket_id}/retry", body or {"reason": "again"})
        answered.setdefault(resp.status_code, resp.json().get("error", "ok"))
        return resp

    def cancelled(address: str) -> str:
        ticket = api.post("/tickets", {"endpoint": address, "input": {}}).json()
        assert api.post(f"/tickets/{ticket['id']}/cancel").status_code == 200
        return ticket["id"]

    make_endpoint("plain")
    assert retry(cancelled("plain")).status_code == 201
    assert retry("01930000-0000-7000-8000-000000000000").status_code == 404
    done = cancelled("plain")
    assert retry(done).status_code == 201
    assert retry(done).status_code == 409  # retried already
    assert retry(cancelled("plain"), {"reason": "x", "budget_s": 10**6}).status_code == 400
    assert retry(cancelled("plain"), {"input": {}}).status_code == 422  # no reason
    outsider = api.as_key(create_api_key(username="nobody-special")[1])
    assert retry(cancelled("plain"), client=outsider).status_code == 404
    # A quarantined endpoint: 423 with the case.
    stuck_endpoint("stuck")
    waiting = cancelled("stuck")
    drive_to_quarantine(admit_ticket(endpoint="stuck", input={"seconds": 30}).ticket.id)
    assert retry(waiting).status_code == 423
    # A paused "reject" endpoint: 409 endpoint_paused.
    make_endpoint("rejecting", busy_policy="reject")
    paused = cancelled("rejecting")
    assert api.post("/endpoints/rejecting/pause", {"reason": "upkeep"}).status_code == 200
    assert retry(paused).status_code == 409
    # A full trace: 429 circuit_open.
    settings.TRACE_HARD_LIMIT = 1
    assert retry(cancelled("plain")).status_code == 429

    undeclared = {s: code for s, code in answered.items() if s not in declared(RETRY)}
    assert not undeclared, f"{RETRY} answers {undeclared}, which its operation does not declare"
    assert {201, 400, 404, 409, 422, 423, 429} <= answered.keys()
