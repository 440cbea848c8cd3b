"""Schemathesis against the API's own OpenAPI document, through the WSGI app.

Every operation of ``/api/v1/openapi.json`` gets generated requests (valid
ones, and invalid ones that must be refused), sent with a staff key to the
real Django app on real PostgreSQL. The test collects every failure class
(route, status, check) over all operations before it fails, so one run shows
everything that is wrong, not just the first thing:

- no response is a server error (5xx);
- every status, content type, header and body is the one the document
  declares for that operation.

The ledger is seeded first (a finished ticket, a running turn, a quarantined
case), and path parameters are often replaced by those real ids, so the
success responses are generated and checked too, not only 404s.

Bounded: ``SCHEMA_FUZZ_EXAMPLES`` examples per operation and mode (default 15).

Every failure class fails the test: no 5xx, every status and body as declared.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import purge_broker

# Bound by CPU (every operation, both modes): on a loaded machine it
# outlasts the suite's 300 s per test.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("SCHEMA_FUZZ_EXAMPLES", "15"))
# Error statuses the routes answer (API.md's table) but do not declare yet.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def seeded(staff_user) -> dict[str, list[str]]:
    """Real ids for path parameters: a finished ticket, a running turn and its
    ticket, a quarantined case, owned by the staff user whose key is used."""
    from endpoints.services import create_endpoint
    from runtime import turns as runtime
    from tests.recovery.conftest import drive_to_quarantine
    from tickets.admission import admit_ticket

    echo = {"kind": "python", "path": "runtime.demo.echo"}
    for address in ("fuzz.echo", "fuzz.busy", "fuzz.stuck"):
        create_endpoint(
            address=address, runner=echo, owners=[staff_user.username], interrupt_grace_s=0.01
        )
    done = admit_ticket(endpoint="fuzz.echo", input={"q": 1}, submitted_by_id=staff_user.id)
    runtime.run_ticket(ticket_id=done.ticket.id)
    busy = admit_ticket(endpoint="fuzz.busy", input={"q": 2}, submitted_by_id=staff_user.id)
    started = runtime.start_turn(ticket_id=busy.ticket.id)
    stuck = admit_ticket(endpoint="fuzz.stuck", input={"q": 3}, submitted_by_id=staff_user.id)
    case = drive_to_quarantine(stuck.ticket.id).case
    return {
        "ticket_id": [str(done.ticket.id), str(busy.ticket.id), str(stuck.ticket.id)],
        "turn_id": [str(started.turn.id), str(case.turn_id)],
        "case_id": [str(case.id)],
        "address": ["fuzz.echo", "fuzz.busy", "fuzz.stuck"],
    }


@pytest.fixture
def schema():
    from config.wsgi import application

    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


def _with_real_ids(strategy, known: dict[str, list[str]]):
    """Half the cases address seeded objects instead of random ids."""

    def substitute(pair):
        case, picks = pair
        for name, value in picks.items():
            if case.path_parameters and name in case.path_parameters:
                case.path_parameters[name] = value
        return case

    picks = st.fixed_dictionaries({name: st.sampled_from(ids) for name, ids in known.items()})
    return st.one_of(strategy, st.tuples(strategy, picks).map(substitute))


def _run_operation(
    operation, mode: GenerationMode, call: Callable, found: dict, known: dict[str, list[str]]
) -> None:
    @given(case=_with_real_ids(operation.as_strategy(generation_mode=mode), known))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # No shrinking: the first example of each failure class is kept as
        # found; a bounded run matters more here than a minimal example.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        response = call(case)
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            for failure in group.exceptions:
                check = type(failure).__name__
                if check == "UndefinedStatusCode" and response.status_code >= 500:
                    check = "ServerError"  # the same failure as not_a_server_error's
                key = (operation.label, response.status_code, check)
                found.setdefault(
                    key,
                    f"{failure.title}: {failure.message[:300]} | "
                    f"{case.as_curl_command(headers=dict(response.request.headers))[:400]}",
                )

    run()


def test_every_operation_conforms_to_the_openapi_document(schema, api_key, seeded, settings):
    settings.STREAM_MAX_S = 0.2  # the running ticket's stream ends soon, not after 300 s
    headers = {"Authorization": f"Bearer {api_key}"}
    found: dict[tuple[str, int, str], str] = {}
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _run_operation(
                    operation, mode, lambda case: case.call(headers=headers), found, seeded
                )
    finally:
        purge_broker()  # admissions published dispatches that no worker takes
    report = "\n".join(
        f"{label} -> {status} {check}\n    {example}"
        for (label, status, check), example in sorted(found.items())
    )
    assert not report, f"failure class(es):\n{report}"
