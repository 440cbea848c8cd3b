"""One router per URL prefix: /api/v1/tickets is the ledger's router
(tickets/api.py), /api/v1/endpoints the runtime's (runtime/api.py), which
mounts the directory's routes of an endpoint (endpoints/api.py, below it).
The paths and operation ids are the ones the routes had before they were
composed so (clients generated from the document keep their names)."""

from __future__ import annotations

import pytest

from config.api import api

TICKETS = {
    "/api/v1/tickets": {"get": "tickets_api_list_tickets", "post": "tickets_api_create_ticket"},
    "/api/v1/tickets/{ticket_id}": {"get": "tickets_api_get_ticket"},
    "/api/v1/tickets/{ticket_id}/events": {"get": "tickets_api_get_events"},
    "/api/v1/tickets/{ticket_id}/stream": {"get": "tickets_api_stream_ticket"},
    "/api/v1/tickets/{ticket_id}/lineage": {"get": "tickets_api_get_lineage"},
    "/api/v1/tickets/{ticket_id}/approve": {"post": "tickets_api_approve"},
    "/api/v1/tickets/{ticket_id}/retry": {"post": "tickets_api_retry_ticket"},
    "/api/v1/tickets/{ticket_id}/delivery/ack": {"post": "tickets_api_ack_delivery"},
    "/api/v1/tickets/{ticket_id}/obligation/close": {"post": "tickets_api_close_obligation"},
    "/api/v1/tickets/{ticket_id}/obligation": {"post": "tickets_api_update_obligation"},
    "/api/v1/tickets/{ticket_id}/cancel": {"post": "runtime_api_cancel"},
}
ENDPOINTS = {
    "/api/v1/endpoints": {
        "get": "runtime_api_list_endpoints",
        "post": "runtime_api_create_endpoint",
    },
    "/api/v1/endpoints/{address}": {
        "get": "runtime_api_get_endpoint",
        "patch": "runtime_api_patch_endpoint",
    },
    "/api/v1/endpoints/{address}/pause": {"post": "runtime_api_pause_endpoint"},
    "/api/v1/endpoints/{address}/resume": {"post": "runtime_api_resume_endpoint"},
    "/api/v1/endpoints/{address}/conversation": {"get": "runtime_api_read_conversation"},
    "/api/v1/endpoints/{address}/approvals": {"get": "runtime_api_list_approvals"},
    "/api/v1/endpoints/{address}/approvals/{ticket_id}/{call_id}": {
        "post": "runtime_api_decide_approval"
    },
    "/api/v1/endpoints/{address}/generations": {"get": "endpoints_api_list_generations"},
    "/api/v1/endpoints/{address}/generations/{number}": {"get": "endpoints_api_get_generation"},
    "/api/v1/endpoints/{address}/proposals": {
        "get": "endpoints_api_list_proposals",
        "post": "endpoints_api_propose",
    },
    "/api/v1/endpoints/{address}/rollback": {"post": "endpoints_api_propose_rollback"},
    "/api/v1/endpoints/{address}/routes": {"get": "endpoints_api_list_routes"},
    "/api/v1/endpoints/{address}/aliases/{alias}/move": {"post": "endpoints_api_move_alias"},
}


def _mounted() -> dict[str, list]:
    mounted: dict[str, list] = {}
    # What config/api.py mounts (ninja lists a mounted router's children in
    # api._routers too, once the URLs are built).
    for prefix, router, *_ in api._router_registrations:
        mounted.setdefault(prefix.strip("/"), []).append(router)
    return mounted


def _view_modules(router) -> set[str]:
    modules = {
        operation.view_func.__module__
        for view in router.path_operations.values()
        for operation in view.operations
    }
    for _, child, *_ in router._routers:
        modules |= _view_modules(child)
    return modules


def test_each_prefix_is_one_router_of_its_owner():
    mounted = _mounted()
    assert all(len(routers) == 1 for routers in mounted.values()), mounted
    (tickets,) = mounted["tickets"]
    assert _view_modules(tickets) == {"tickets.api"}
    (endpoints,) = mounted["endpoints"]
    assert _view_modules(endpoints) == {"runtime.api", "endpoints.api"}


@pytest.mark.django_db
def test_paths_and_operation_ids_are_those_of_before(client):
    document = client.get("/api/v1/openapi.json").json()
    paths = {
        path: {method: operation["operationId"] for method, operation in methods.items()}
        for path, methods in document["paths"].items()
    }
    mine = {
        p: ops for p, ops in paths.items() if p.startswith(("/api/v1/tickets", "/api/v1/endpoints"))
    }
    assert mine == TICKETS | ENDPOINTS
    # In the order they were listed (and Django tries them) before.
    assert [p for p in paths if p in mine] == [*TICKETS, *ENDPOINTS]
    for path in ENDPOINTS:
        for operation in document["paths"][path].values():
            assert operation["tags"] == ["endpoints"], path
