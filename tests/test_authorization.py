"""The authorisation matrix (API.md "Who may see and do what"): every
/api/v1 route, walked from the ninja API object itself, against every kind of
caller, and the console's pages that show one object. Each cell expects one
status: any other answer fails, an unexpected 2xx above all. A route with no
row here fails too, so a new route cannot ship without deciding who may use
it.

Callers: no key, a stranger (a key that owns and submitted nothing), the
ticket's submitter, an owner of its endpoint, staff, and for the turn routes
the credential of that exact turn and of another turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from accounts.keys import create_api_key
from config.api import api as ninja_api
from endpoints.services import create_endpoint
from recovery import services as recovery_services
from recovery.models import DecisionAction
from runtime import services as runtime_services
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db

ACTORS = ("anonymous", "stranger", "submitter", "owner", "staff", "turn", "other_turn")
USERS = ("stranger", "submitter", "owner", "staff")


# --- The world each cell acts on (built lazily: only what its route needs) --------------------


class World:
    def __init__(self) -> None:
        model = get_user_model()
        self.users = {
            name: model.objects.create_user(name, is_staff=name == "staff") for name in USERS
        }
        self.keys = {name: create_api_key(username=name)[1] for name in USERS}
        self._endpoints: set[str] = set()
        self._cache: dict[str, Any] = {}

    def endpoint(self, address: str, owners=("owner",), **kw) -> str:
        if address not in self._endpoints:
            create_endpoint(
                address=address,
                runner={"kind": "python", "path": "runtime.demo.echo"},
                owners=list(owners),
                **kw,
            )
            self._endpoints.add(address)
        return address

    def registered_worker(self) -> str:
        from runtime import registry

        return self.once(
            "worker",
            lambda: (
                registry.register_worker(
                    name="turns@matrix", host="matrix", pid=1, queues=["turns"], pool_size=1
                ).name
            ),
        )

    def admit(self, address: str, **kw) -> Ticket:
        return admit_ticket(
            endpoint=address, input={"n": len(self._cache)}, submitter=self.users["submitter"], **kw
        ).ticket

    def once(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    # A queued root ticket of the submitter on an endpoint the owner owns,
    # with a child on an endpoint nobody owns (for lists and traces).
    def ticket(self) -> Ticket:
        def make():
            root = self.admit(self.endpoint("m.ep"))
            admit_ticket(
                endpoint=self.endpoint("m.nobodys", owners=()), input={"c": 1}, parent_id=root.id
            )
            return root

        return self.once("ticket", make)

    def child(self) -> Ticket:
        self.ticket()
        return Ticket.objects.get(parent_id=self.ticket().id)

    def gated(self) -> Ticket:
        """Finished, awaiting an owner's approval."""

        def make():
            ticket = self.admit(self.endpoint("m.gated", requires_approval=True))
            runtime.run_ticket(ticket_id=ticket.id)
            return ticket

        return self.once("gated", make)

    def delivered_by_pull(self) -> Ticket:
        """Finished, its pull delivery pending: the requester acknowledges."""

        def make():
            ticket = self.admit(self.endpoint("m.done"))
            runtime.run_ticket(ticket_id=ticket.id)
            return ticket

        return self.once("pull", make)

    def cancelled(self) -> Ticket:
        """The submitter's ticket, cancelled while queued: retryable."""

        def make():
            ticket = self.admit(self.endpoint("m.ep"))
            runtime_services.cancel_ticket(ticket_id=ticket.id, actor="test", reason="matrix")
            return ticket

        return self.once("cancelled", make)

    def turn(self, name: str = "turn") -> runtime.Started:
        """A running turn (started, its runner not run) and its token."""

        def make():
            address = self.endpoint(f"m.{name}")
            ticket = self.admit(address)
            started = runtime.start_turn(ticket_id=ticket.id)
            assert started is not None and started.token
            return started

        return self.once(name, make)

    def case(self):
        def make():
            # A grace that has run out by the first look: no poll waits.
            address = self.endpoint("m.stuck", interrupt_grace_s=0.001)
            ticket = self.admit(address)
            started = runtime.start_turn(ticket_id=ticket.id)
            runtime.request_interrupt(turn_id=started.turn.id, reason="deadline", actor="test")
            return wait_for(
                lambda: runtime.quarantine_turn(turn_id=started.turn.id),
                timeout=10,
                message="quarantine",
            )

        return self.once("case", make)

    def inspected_case(self):
        case = self.case()
        inspection = self.once(
            "inspection",
            lambda: recovery_services.inspect_case(case_id=case, user=self.users["owner"]),
        )
        return case, inspection

    def decided_case(self):
        case, inspection = self.inspected_case()
        self.once(
            "decision",
            lambda: recovery_services.decide(
                case_id=case,
                user=self.users["owner"],
                action=DecisionAction.FINALIZE_ORPHAN,
                inspection_id=inspection.id,
                rationale="the matrix needs a decided case",
            ),
        )
        return case

    def lesson(self):
        case = self.decided_case()
        self.once(
            "lesson",
            lambda: recovery_services.write_lesson(
                case_id=case,
                user=self.users["owner"],
                what_failed="a",
                evidence="b",
                prevention="c",
            ),
        )
        return case

    def proposal(self) -> str:
        """A change of m.gov proposed by a co-owner (so the owner and staff
        are second persons)."""

        def make():
            from endpoints.proposals import propose_change

            coowner = get_user_model().objects.create_user("coowner")
            self.endpoint("m.gov", owners=("owner", "coowner"))
            return str(
                propose_change(
                    address="m.gov",
                    user=coowner,
                    base_generation=1,
                    changes={"notes": "check the tool first"},
                    reason="the matrix proposes",
                ).id
            )

        return self.once("proposal", make)

    def changed_endpoint(self) -> str:
        """m.changed at generation 2 (a staff change)."""

        def make():
            from endpoints.services import update_endpoint

            self.endpoint("m.changed")
            update_endpoint(address="m.changed", changes={"turn_budget_s": 60}, reason="matrix")
            return "m.changed"

        return self.once("changed", make)

    def agent_approval(self) -> tuple[Ticket, str]:
        """The submitter's ticket on an agent endpoint the owner owns, waiting
        for an owner's approval of one tool call."""

        def make():
            from runtime.agents.runner import preload

            address = "m.agent"
            runner = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}
            # Warm first: this test's transaction is invisible to the heartbeat
            # thread, so the turn must end before its first beat (5 s).
            preload(runner)
            create_endpoint(
                address=address,
                runner={
                    "kind": "agent",
                    "framework": "pydantic_ai",
                    "path": "runtime.demo.agent",
                },
                owners=["owner"],
            )
            ticket = admit_ticket(
                endpoint=address, input={"prompt": "send ops"}, submitter=self.users["submitter"]
            ).ticket
            runtime.run_ticket(ticket_id=ticket.id)
            wait = ticket.events.get(kind="waiting_for_children")
            [call_id] = list(wait.detail["continuation"]["agent"]["pending"])
            return ticket, call_id

        return self.once("agent_approval", make)

    def schedule(self) -> str:
        """A schedule of the owner's endpoint, made by the owner."""
        from tickets import schedules

        return self.once(
            "schedule",
            lambda: str(
                schedules.create_schedule(
                    user=self.users["owner"], endpoint=self.endpoint("m.ep"), every_s=3600, input={}
                ).id
            ),
        )

    def bearer(self, actor: str) -> str | None:
        if actor == "anonymous":
            return None
        if actor == "turn":
            return self.turn().token
        if actor == "other_turn":
            return self.turn("other-turn").token
        return self.keys[actor]


# --- The API matrix ---------------------------------------------------------------------------


@dataclass
class Row:
    """One route: how to call it in a world, and the status for each caller."""

    call: Callable[[World], tuple[str, dict | None]]  # -> (path, JSON body)
    expect: dict[str, int]
    # Optional check of a 2xx body: only what the caller may see is in it.
    check: Callable[[World, str, Any], None] | None = None
    notes: list[str] = field(default_factory=list)


def _statuses(anonymous=401, stranger=200, submitter=200, owner=200, staff=200, turn=401,
              other_turn=401) -> dict[str, int]:  # fmt: skip
    return dict(
        anonymous=anonymous,
        stranger=stranger,
        submitter=submitter,
        owner=owner,
        staff=staff,
        turn=turn,
        other_turn=other_turn,
    )


# Who may see a ticket: its submitter, the endpoint's owners, staff; a
# stranger gets 404 exactly as for an unknown id.
SEES_TICKET = _statuses(stranger=404)
# Owner actions on a ticket: a submitter sees it but may not (403).
OWNER_ACTION = _statuses(stranger=404, submitter=403)
# Recovery: the owners' and staff's only; to everyone else it does not exist.
OWNERS_CASE = _statuses(stranger=404, submitter=404)
OWNERS_CASE_CREATE = _statuses(stranger=404, submitter=404, owner=201, staff=201)
STAFF_ONLY = _statuses(stranger=403, submitter=403, owner=403)
# The turn API: only that turn's own credential; any user's key is 403.
TURN_ONLY = _statuses(stranger=403, submitter=403, owner=403, staff=403, turn=200, other_turn=403)


def _check_ticket_list(world: World, actor: str, body: Any) -> None:
    ids = {t["id"] for t in body["items"]}
    root, child = str(world.ticket().id), str(world.child().id)
    assert (root in ids) == (actor in ("submitter", "owner", "staff")), ids
    assert (child in ids) == (actor == "staff"), ids  # nobody owns its endpoint


def _check_lineage(world: World, actor: str, body: Any) -> None:
    ids = {n["id"] for n in body["nodes"]}
    assert str(world.ticket().id) in ids
    assert (str(world.child().id) in ids) == (actor == "staff"), ids


def _check_case_list(world: World, actor: str, body: Any) -> None:
    ids = {c["id"] for c in body}
    assert (str(world.case()) in ids) == (actor in ("owner", "staff")), ids


def _check_review_queue(world: World, actor: str, body: Any) -> None:
    ids = {p["id"] for p in body}
    assert (world.proposal() in ids) == (actor in ("owner", "staff")), ids


def _check_schedule_list(world: World, actor: str, body: Any) -> None:
    ids = {s["id"] for s in body}
    assert (world.schedule() in ids) == (actor in ("owner", "staff")), ids


def _seq(world: World, name: str = "turn") -> int:
    return world.turn(name).turn.seq


MATRIX: dict[tuple[str, str], Row] = {
    ("POST", "/endpoints"): Row(
        lambda w: (
            "/endpoints",
            {"address": "m.new", "runner": {"kind": "python", "path": "runtime.demo.echo"}},
        ),
        {**STAFF_ONLY, "staff": 201},
    ),
    ("GET", "/endpoints"): Row(lambda w: (f"/endpoints?{w.endpoint('m.ep')}", None), _statuses()),
    ("GET", "/endpoints/{address}"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}", None), _statuses()
    ),
    ("PATCH", "/endpoints/{address}"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}", {"turn_budget_s": 60}), STAFF_ONLY
    ),
    # An agent's conversation and pending calls: its owners and staff only.
    ("GET", "/endpoints/{address}/conversation"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/conversation", None),
        _statuses(stranger=403, submitter=403),
    ),
    ("GET", "/endpoints/{address}/approvals"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/approvals", None),
        _statuses(stranger=403, submitter=403),
    ),
    # Deciding a call: the owner decides (staff's same decision converges);
    # the submitter sees the ticket but may not; to a stranger it does not exist.
    ("POST", "/endpoints/{address}/approvals/{ticket_id}/{call_id}"): Row(
        lambda w: (
            f"/endpoints/m.agent/approvals/{w.agent_approval()[0].id}/{w.agent_approval()[1]}",
            {"approve": True, "reason": "the matrix approves"},
        ),
        _statuses(stranger=404, submitter=403),
    ),
    # A restricted endpoint: only the listed submitter, the owners and staff.
    ("POST", "/tickets"): Row(
        lambda w: (
            "/tickets",
            {
                "endpoint": w.endpoint("m.restricted", submitters={"users": ["submitter"]}),
                "input": {"q": 1},
            },
        ),
        _statuses(stranger=403, submitter=201, owner=201, staff=201),
    ),
    ("GET", "/tickets"): Row(
        lambda w: (f"/tickets?trace_id={w.ticket().trace_id}", None),
        _statuses(),
        check=_check_ticket_list,
    ),
    ("GET", "/tickets/{ticket_id}"): Row(
        lambda w: (f"/tickets/{w.ticket().id}", None), SEES_TICKET
    ),
    ("GET", "/tickets/{ticket_id}/events"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/events", None), SEES_TICKET
    ),
    # The stream is not read here (its status is the question): a 200 is its first byte.
    ("GET", "/tickets/{ticket_id}/stream"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/stream", None), SEES_TICKET
    ),
    ("GET", "/tickets/{ticket_id}/lineage"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/lineage", None), SEES_TICKET, check=_check_lineage
    ),
    ("POST", "/tickets/{ticket_id}/cancel"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/cancel", None), SEES_TICKET
    ),
    # A retry: the endpoint's owners, staff, and the submitter for their own.
    ("POST", "/tickets/{ticket_id}/retry"): Row(
        lambda w: (f"/tickets/{w.cancelled().id}/retry", {"reason": "matrix"}),
        _statuses(stranger=404, submitter=201, owner=201, staff=201),
    ),
    ("POST", "/tickets/{ticket_id}/approve"): Row(
        lambda w: (f"/tickets/{w.gated().id}/approve", None), OWNER_ACTION
    ),
    ("POST", "/tickets/{ticket_id}/delivery/ack"): Row(
        lambda w: (f"/tickets/{w.delivered_by_pull().id}/delivery/ack", None), SEES_TICKET
    ),
    ("POST", "/tickets/{ticket_id}/obligation"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/obligation", {"note": "on it"}), OWNER_ACTION
    ),
    ("POST", "/tickets/{ticket_id}/obligation/close"): Row(
        lambda w: (f"/tickets/{w.ticket().id}/obligation/close", {"note": "done"}), OWNER_ACTION
    ),
    # Whoever may see the turn's ticket, or the turn itself.
    ("GET", "/turns/{turn_id}"): Row(
        lambda w: (f"/turns/{w.turn().turn.id}", None), {**SEES_TICKET, "turn": 200}
    ),
    ("POST", "/turns/{turn_id}/heartbeat"): Row(
        lambda w: (f"/turns/{w.turn().turn.id}/heartbeat", {"seq": _seq(w)}), TURN_ONLY
    ),
    ("POST", "/turns/{turn_id}/result"): Row(
        lambda w: (f"/turns/{w.turn().turn.id}/result", {"seq": _seq(w), "result": {"ok": 1}}),
        TURN_ONLY,
    ),
    ("POST", "/turns/{turn_id}/stopped"): Row(
        lambda w: (f"/turns/{w.turn().turn.id}/stopped", {"seq": _seq(w)}), TURN_ONLY
    ),
    ("GET", "/recovery/cases"): Row(
        lambda w: (f"/recovery/cases?{w.case()}", None), _statuses(), check=_check_case_list
    ),
    ("GET", "/recovery/cases/{case_id}"): Row(
        lambda w: (f"/recovery/cases/{w.case()}", None), OWNERS_CASE
    ),
    ("POST", "/recovery/cases/{case_id}/inspections"): Row(
        lambda w: (f"/recovery/cases/{w.case()}/inspections", None), OWNERS_CASE_CREATE
    ),
    ("POST", "/recovery/cases/{case_id}/decisions"): Row(
        lambda w: (
            f"/recovery/cases/{w.inspected_case()[0]}/decisions",
            {
                "action": "keep_quarantined",
                "inspection": str(w.inspected_case()[1].id),
                "rationale": "not yet",
            },
        ),
        OWNERS_CASE_CREATE,
    ),
    # A decided case whose turn no worker slot holds: the owners get as far
    # as the 409 that says so; anyone else cannot see the case.
    ("POST", "/recovery/cases/{case_id}/stop-process"): Row(
        lambda w: (f"/recovery/cases/{w.decided_case()}/stop-process", {"rationale": "free it"}),
        _statuses(stranger=404, submitter=404, owner=409, staff=409),
    ),
    ("GET", "/workers"): Row(lambda w: ("/workers", None), STAFF_ONLY),
    # Schedules: the endpoint's owners and staff. Everyone may read the
    # endpoint, so scheduling it is refused (403); someone else's schedule
    # does not exist (404).
    ("POST", "/schedules"): Row(
        lambda w: ("/schedules", {"endpoint": w.endpoint("m.ep"), "every_s": 3600, "input": {}}),
        _statuses(stranger=403, submitter=403, owner=201, staff=201),
    ),
    ("GET", "/schedules"): Row(
        lambda w: (f"/schedules?{w.schedule()}", None), _statuses(), check=_check_schedule_list
    ),
    ("GET", "/schedules/{schedule_id}"): Row(
        lambda w: (f"/schedules/{w.schedule()}", None), OWNERS_CASE
    ),
    ("POST", "/schedules/{schedule_id}/pause"): Row(
        lambda w: (f"/schedules/{w.schedule()}/pause", None), OWNERS_CASE
    ),
    ("POST", "/schedules/{schedule_id}/resume"): Row(
        lambda w: (f"/schedules/{w.schedule()}/resume", None), OWNERS_CASE
    ),
    ("DELETE", "/schedules/{schedule_id}"): Row(
        lambda w: (f"/schedules/{w.schedule()}", None), OWNERS_CASE
    ),
    # Governed change: the endpoint's owners and staff; to anyone else it
    # does not exist.
    ("GET", "/endpoints/{address}/generations"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/generations", None), OWNERS_CASE
    ),
    ("GET", "/endpoints/{address}/generations/{number}"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/generations/1", None), OWNERS_CASE
    ),
    ("GET", "/endpoints/{address}/proposals"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/proposals", None), OWNERS_CASE
    ),
    ("POST", "/endpoints/{address}/proposals"): Row(
        lambda w: (
            f"/endpoints/{w.endpoint('m.ep')}/proposals",
            {"generation": 1, "changes": {"turn_budget_s": 30}, "reason": "matrix"},
        ),
        OWNERS_CASE_CREATE,
    ),
    ("POST", "/endpoints/{address}/rollback"): Row(
        lambda w: (
            f"/endpoints/{w.changed_endpoint()}/rollback",
            {"to_generation": 1, "generation": 2, "reason": "matrix"},
        ),
        OWNERS_CASE_CREATE,
    ),
    ("GET", "/endpoints/{address}/routes"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/routes", None), OWNERS_CASE
    ),
    ("POST", "/endpoints/{address}/aliases/{alias}/move"): Row(
        lambda w: (
            f"/endpoints/{w.endpoint('m.routed', aliases=['m.route'])}/aliases/m.route/move",
            {"to": w.endpoint("m.ep"), "reason": "matrix"},
        ),
        OWNERS_CASE_CREATE,
    ),
    ("GET", "/proposals"): Row(
        lambda w: (f"/proposals?{w.proposal()}", None), _statuses(), check=_check_review_queue
    ),
    ("GET", "/proposals/{proposal_id}"): Row(
        lambda w: (f"/proposals/{w.proposal()}", None), OWNERS_CASE
    ),
    ("POST", "/proposals/{proposal_id}/review"): Row(
        lambda w: (f"/proposals/{w.proposal()}/review", {"approve": True, "reason": "matrix"}),
        OWNERS_CASE_CREATE,
    ),
    ("POST", "/recovery/cases/{case_id}/lesson/proposals"): Row(
        lambda w: (
            f"/recovery/cases/{w.lesson()}/lesson/proposals",
            {"generation": 1, "changes": {"notes": "check first"}},
        ),
        OWNERS_CASE_CREATE,
    ),
    # Draining a worker: staff only (no worker process answers here: 200
    # with answered false, after the command's reply timeout).
    ("POST", "/workers/{name}/consuming"): Row(
        lambda w: (
            f"/workers/{w.registered_worker()}/consuming",
            {"queue": "turns", "consume": False, "reason": "matrix"},
        ),
        STAFF_ONLY,
    ),
    # Pause and resume: the endpoint's owners and staff. Everyone may read
    # an endpoint, so a stranger is told no (403), not that it is not there.
    ("POST", "/endpoints/{address}/pause"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/pause", {"reason": "matrix"}),
        _statuses(stranger=403, submitter=403),
    ),
    ("POST", "/endpoints/{address}/resume"): Row(
        lambda w: (f"/endpoints/{w.endpoint('m.ep')}/resume", {"reason": "matrix"}),
        _statuses(stranger=403, submitter=403),
    ),
    ("POST", "/recovery/cases/{case_id}/lesson"): Row(
        lambda w: (
            f"/recovery/cases/{w.decided_case()}/lesson",
            {"what_failed": "a", "evidence": "b", "prevention": "c"},
        ),
        OWNERS_CASE_CREATE,
    ),
}


def registered_routes() -> list[tuple[str, str]]:
    """Every operation the API serves, from the ninja API object (what the
    URLconf routes), not from this file."""
    routes = []

    def walk(prefix: str, router) -> None:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                for method in operation.methods:
                    routes.append((method, f"{prefix}{path}"))
        # A router mounted in another (the directory's under /endpoints).
        for child_prefix, child, *_ in router._routers:
            walk(f"{prefix}{child_prefix}", child)

    for prefix, router, *_ in ninja_api._router_registrations:
        walk(prefix, router)
    return sorted(set(routes))


def test_the_walk_finds_the_routes_the_openapi_document_lists():
    """The walk above sees what clients see (and would see a route the
    schema hides), so the matrix below cannot silently miss a route."""
    schema = ninja_api.get_openapi_schema()
    documented = {
        (method.upper(), path.removeprefix("/api/v1"))
        for path, operations in schema["paths"].items()
        for method in operations
    }
    assert documented <= set(registered_routes())
    assert len(registered_routes()) >= len(MATRIX) > 20


def test_every_matrix_row_is_a_route():
    assert set(MATRIX) <= set(registered_routes()), set(MATRIX) - set(registered_routes())


def _call(client, method: str, path: str, body: dict | None, bearer: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {bearer}"} if bearer else {}
    data = json.dumps(body) if body is not None else ""
    return client.generic(
        method, f"/api/v1{path}", data, content_type="application/json", **headers
    )


@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize(("method", "route"), registered_routes())
def test_api_matrix(client, method, route, actor):
    row = MATRIX.get((method, route))
    assert row is not None, (
        f"{method} {route} has no row in the authorisation matrix: decide who may use it"
    )
    world = World()
    path, body = row.call(world)
    bearer = world.bearer(actor)
    response = _call(client, method, path, body, bearer)
    expected = row.expect[actor]
    assert response.status_code == expected, (
        f"{actor} {method} {path}: expected {expected}, got {response.status_code} "
        f"{response.content[:300]!r}"
    )
    if 200 <= expected < 300 and row.check is not None:
        row.check(world, actor, response.json())
    if expected >= 400:
        assert (
            response.json()["error"]
            in {
                401: ["unauthenticated"],
                403: ["forbidden"],
                404: ["not_found"],
                409: ["invalid_transition"],
            }[expected]
        )


def test_a_strangers_404_is_the_same_as_for_an_unknown_ticket(client):
    world = World()
    ticket = world.ticket()
    missing = "01930000-0000-7000-8000-000000000000"
    for suffix in ("", "/events", "/stream", "/lineage"):
        theirs = _call(client, "GET", f"/tickets/{ticket.id}{suffix}", None, world.keys["stranger"])
        unknown = _call(client, "GET", f"/tickets/{missing}{suffix}", None, world.keys["stranger"])
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["detail"].replace(str(ticket.id), "ID") == unknown.json()[
            "detail"
        ].replace(missing, "ID")


@pytest.mark.parametrize("via", ("trace_id", "traceparent"))
@pytest.mark.parametrize("actor", USERS)
def test_only_who_sees_a_ticket_of_a_trace_adds_to_it(client, actor, via, settings):
    """API.md "Traces belong to their tickets' viewers": a stranger naming
    another's trace (in the body or a ``traceparent``) lands in a trace of
    its own, and the number of admissions it gets before the breaker's 429
    is the hard limit, whatever the other trace holds."""
    world = World()
    trace_id = world.ticket().trace_id  # the submitter's root and a child
    size = Ticket.objects.filter(trace_id=trace_id).count()
    settings.TRACE_HARD_LIMIT = size + 1
    settings.TRACE_SOFT_LIMIT = size
    headers = {}
    if via == "traceparent":
        headers = {"HTTP_TRACEPARENT": f"00-{trace_id}-00f067aa0ba902b7-01"}
    admitted, refused = [], None
    for i in range(settings.TRACE_HARD_LIMIT + 1):
        body = {"endpoint": world.endpoint("m.ep"), "input": {"join": i}}
        if via == "trace_id":
            body["trace_id"] = trace_id
        response = client.post(
            "/api/v1/tickets",
            json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {world.keys[actor]}",
            **headers,
        )
        if response.status_code == 429:
            refused = response
            break
        assert response.status_code == 201, response.content
        admitted.append(response.json())
    assert refused is not None and refused.json()["error"] == "circuit_open"
    if actor == "stranger":
        assert len(admitted) == settings.TRACE_HARD_LIMIT  # the size of its own trace
        assert {t["trace_id"] for t in admitted} != {trace_id}
        assert len({t["trace_id"] for t in admitted}) == 1
        assert trace_id not in refused.content.decode()
        assert Ticket.objects.filter(trace_id=trace_id).count() == size
    else:
        # The breaker counts per party: the trace's tickets so far are the
        # submitter's (its root and the runtime's child of it).
        own = size if actor == "submitter" else 0
        assert len(admitted) == settings.TRACE_HARD_LIMIT - own
        assert {t["trace_id"] for t in admitted} == {trace_id}


@pytest.mark.parametrize("actor", USERS)
def test_runner_settings_and_submitter_lists_only_to_owners_and_staff(client, actor):
    """API.md "Runner details are for owners and staff": the API's endpoint
    routes and the console's endpoint page show everyone the address, state,
    budgets and policies; the runner's settings and who may submit only to
    the endpoint's owners and staff."""
    world = World()
    address = world.endpoint("m.conf", submitters={"users": ["submitter"]})
    full = actor in ("owner", "staff")
    key = world.keys[actor]
    one = _call(client, "GET", f"/endpoints/{address}", None, key).json()
    listed = next(
        e for e in _call(client, "GET", "/endpoints", None, key).json() if e["address"] == address
    )
    for body in (one, listed):
        assert body["state"] == "available" and body["busy_policy"] == "enqueue"
        assert {"turn_budget_s", "interrupt_grace_s", "requires_approval"} <= set(body)
        assert ("runtime.demo.echo" in json.dumps(body)) == full, (actor, body)
        assert ("submitters" in body) == full, (actor, body)
        assert body["runner"]["kind"] == "python"
    client.force_login(world.users[actor])
    page = client.get(f"/endpoints/{address}/").content.decode()
    assert ("runtime.demo.echo" in page) == full, actor
    assert ("<code>submitter</code>" in page) == full, actor


# --- The console matrix: pages that show one object ---------------------------------------------

CONSOLE_USERS = ("stranger", "submitter", "owner", "staff")
HX = {"HTTP_HX_REQUEST": "true"}

# (method, url maker, htmx, {actor: status}); anonymous visitors are sent to
# the login page (302) from every one of them.
CONSOLE: dict[str, tuple[str, Callable[[World], str], dict, dict[str, int]]] = {
    "ticket page": (
        "GET",
        lambda w: f"/tickets/{w.ticket().id}/",
        {},
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    "ticket region": (
        "GET",
        lambda w: f"/tickets/{w.ticket().id}/",
        HX,
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    "trace page": (
        "GET",
        lambda w: f"/traces/{w.ticket().trace_id}/",
        {},
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    "trace region": (
        "GET",
        lambda w: f"/traces/{w.ticket().trace_id}/",
        HX,
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    "case page": (
        "GET",
        lambda w: f"/recovery/{w.case()}/",
        {},
        dict(stranger=404, submitter=404, owner=200, staff=200),
    ),
    "case region": (
        "GET",
        lambda w: f"/recovery/{w.case()}/",
        HX,
        dict(stranger=404, submitter=404, owner=200, staff=200),
    ),
    "approve": (
        "POST",
        lambda w: f"/tickets/{w.gated().id}/approve/",
        HX,
        dict(stranger=404, submitter=403, owner=200, staff=200),
    ),
    # Cancel follows the API: whoever sees the ticket may cancel it.
    "cancel": (
        "POST",
        lambda w: f"/tickets/{w.ticket().id}/cancel/",
        HX,
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    # Retry follows the API: the owners, staff, and the submitter for their own.
    "retry": (
        "POST",
        lambda w: f"/tickets/{w.cancelled().id}/retry/",
        HX,
        dict(stranger=404, submitter=200, owner=200, staff=200),
    ),
    "obligation": (
        "POST",
        lambda w: f"/tickets/{w.ticket().id}/obligation/",
        HX,
        dict(stranger=404, submitter=403, owner=200, staff=200),
    ),
    "inspect": (
        "POST",
        lambda w: f"/recovery/{w.case()}/inspections/",
        HX,
        dict(stranger=404, submitter=404, owner=200, staff=200),
    ),
}


@pytest.mark.parametrize("actor", ("anonymous", *CONSOLE_USERS))
@pytest.mark.parametrize("name", sorted(CONSOLE))
def test_console_matrix(client, name, actor):
    method, url_of, headers, expect = CONSOLE[name]
    world = World()
    url = url_of(world)
    if actor != "anonymous":
        client.force_login(world.users[actor])
    data = {
        "obligation": {"note": "on it"},
        "cancel": {"reason": "not needed"},
        "retry": {"reason": "try again"},
    }.get(name, {})
    # An anonymous htmx request is redirected client-side; plain requests 302.
    response = getattr(client, method.lower())(
        url, data, **({} if actor == "anonymous" else headers)
    )
    expected = 302 if actor == "anonymous" else expect[actor]
    assert response.status_code == expected, (
        f"{actor} {method} {url}: expected {expected}, got {response.status_code}"
    )


@pytest.mark.parametrize("actor", CONSOLE_USERS)
def test_console_lists_show_only_what_the_user_may_see(client, actor):
    world = World()
    root, child, case = world.ticket(), world.child(), world.lesson()
    client.force_login(world.users[actor])
    sees_root = actor in ("submitter", "owner", "staff")
    sees_child = actor == "staff"
    sees_case = actor in ("owner", "staff")
    for url in ("/", "/tickets/", "/obligations/"):
        body = client.get(url).content.decode()
        assert (str(root.id) in body) == sees_root, (actor, url)
        assert str(child.id) not in body or sees_child, (actor, url)
    # The endpoint page's recent turns and lock holder link to their tickets.
    running = world.turn().ticket
    body = client.get("/endpoints/m.turn/").content.decode()
    assert (f'href="/tickets/{running.id}/"' in body) == sees_root, actor
    assert str(world.turn().turn.id)[-8:] in body  # the turn itself is the endpoint's
    trace = client.get(f"/traces/{root.trace_id}/")
    if sees_root:
        assert (str(child.id) in trace.content.decode()) == sees_child, actor
    for url in ("/recovery/", "/lessons/", "/endpoints/m.stuck/"):
        body = client.get(url).content.decode()
        assert (f'href="/recovery/{case}/"' in body) == sees_case, (actor, url)
