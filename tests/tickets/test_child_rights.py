"""Children carry their submitter's rights (tickets/rights.py): a ticket the
runtime admits for a ticket goes only where the submitter the trace carries
may submit, or where the asking endpoint's owners named the target in the
generation its turn ran under (an agent's ``delegate_to``) and may submit
themselves. A target taken from the ticket's input is never enough.

Real PostgreSQL; each turn run in this process (``run_ticket``), its
runner in a turn process of its own, as on a worker."""

from __future__ import annotations

import pytest

from runtime import turns as runtime
from tickets import traces
from tickets.admission import admit_ticket
from tickets.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)

RESEARCH = "runtime.demo.research"
AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "tests.agents.rounds_agent.build"}
# Its owners and staff only: nobody listed.
OWNERS_ONLY = {"users": [], "groups": []}


@pytest.fixture
def people(django_user_model):
    names = ("alice", "bob", "carol", "dave", "mallory")
    return {n: django_user_model.objects.create_user(n, password="pw") for n in names}


def run(ticket: Ticket) -> Ticket:
    runtime.run_ticket(ticket_id=ticket.id)
    ticket.refresh_from_db()
    return ticket


def submit(user, endpoint: str, input: dict, **kw) -> Ticket:  # noqa: A002
    return admit_ticket(endpoint=endpoint, input=input, submitter=user, **kw).ticket


def children_of(ticket: Ticket) -> list[Ticket]:
    return list(Ticket.objects.filter(parent=ticket, callback_for__isnull=True).order_by("id"))


def assert_refused(parent: Ticket, target: str, *, already: int = 0) -> None:
    """The turn failed ``forbidden`` naming the target; nothing was
    admitted: the target holds only the ``already`` tickets it had, and the
    trace's breaker counts only the trace's tickets."""
    assert parent.state == "failed", (parent.state, parent.result)
    assert parent.error["code"] == "forbidden", parent.error
    assert target in parent.error["detail"]
    assert children_of(parent) == []
    assert Ticket.objects.filter(endpoint__address=target).count() == already
    assert (
        traces.counted(parent.trace_id) == Ticket.objects.filter(trace_id=parent.trace_id).count()
    )


def assert_available(make_owner_ticket) -> None:
    """The target's owner still gets their own work done there."""
    own = make_owner_ticket()
    assert run(own).state == "succeeded", own.error
    assert own.endpoint.state == "available"


# --- A python runner whose children's endpoint comes from its input ------------------------


def test_research_child_on_a_restricted_endpoint_its_submitter_may_not_use_is_refused(
    make_endpoint, people
):
    make_endpoint("a.research", path=RESEARCH, owners=["alice"])
    make_endpoint("b.private", owners=["bob"], submitters=OWNERS_ONLY)

    parent = run(
        submit(people["alice"], "a.research", {"children": 3, "child_endpoint": "b.private"})
    )

    assert_refused(parent, "b.private")
    assert parent.error["detail"] == (
        "cannot dispatch children: children carry their submitter's rights: neither this "
        "trace's submitter nor (through delegate_to) this endpoint's owners may submit to "
        "'b.private'"
    )
    assert_available(lambda: submit(people["bob"], "b.private", {"mine": 1}))


def test_research_child_goes_where_its_submitter_may_submit(make_endpoint, people):
    make_endpoint("a.research", path=RESEARCH, owners=["alice"])
    make_endpoint("b.private", owners=["bob"], submitters={"users": ["carol"]})

    parent = run(
        submit(people["carol"], "a.research", {"children": 2, "child_endpoint": "b.private"})
    )

    assert parent.state == "waiting", parent.error
    children = children_of(parent)
    assert [c.endpoint.address for c in children] == ["b.private", "b.private"]
    # The callback to the parent's own endpoint is no submission of theirs.
    for child in children:
        assert run(child).state == "succeeded"
    for callback in Ticket.objects.filter(callback_for__in=children).order_by("id"):
        run(callback)
    parent.refresh_from_db()
    assert parent.state == "succeeded", parent.error


def test_all_children_or_none(make_endpoint, people):
    """One wait naming an allowed endpoint and a refused one admits neither."""
    make_endpoint("a.fanout", path="tests.tickets.child_runners.targets", owners=["alice"])
    make_endpoint("c.open")
    make_endpoint("b.private", owners=["bob"], submitters=OWNERS_ONLY)

    parent = run(submit(people["carol"], "a.fanout", {"targets": ["c.open", "b.private"]}))

    assert_refused(parent, "b.private")
    assert not Ticket.objects.filter(endpoint__address="c.open").exists()


def test_grandchild_carries_the_root_submitters_rights(make_endpoint, people):
    make_endpoint("a.research", path=RESEARCH, owners=["alice"])
    make_endpoint("m.research", path=RESEARCH, owners=["mallory"])
    make_endpoint("b.private", owners=["bob"], submitters={"users": ["carol"]})
    nested = {"children": 1, "child_endpoint": "m.research"}
    nested["child_input"] = {"children": 1, "child_endpoint": "b.private"}

    # Carol may submit to b.private: her trace reaches it two levels down,
    # though neither research endpoint's owners may.
    root = run(submit(people["carol"], "a.research", nested))
    [child] = children_of(root)
    child = run(child)
    assert child.state == "waiting", child.error
    [grandchild] = children_of(child)
    assert grandchild.endpoint.address == "b.private"
    assert grandchild.submitted_by_id is None  # admitted by the runtime, not by her

    # Dave may not: the same chain stops at the middle turn.
    root = run(submit(people["dave"], "a.research", nested))
    [child] = children_of(root)
    assert_refused(run(child), "b.private", already=1)


def test_the_rights_are_the_nearest_submitters_not_an_earlier_ones(make_endpoint, people):
    """Dave, an owner of the endpoint Carol's root runs on, may admit under
    her ticket; his ticket's children carry his rights, not hers."""
    make_endpoint("c.home", owners=["dave"])
    make_endpoint("a.research", path=RESEARCH, owners=["alice"])
    make_endpoint("b.private", owners=["bob"], submitters={"users": ["carol"]})
    root = submit(people["carol"], "c.home", {})
    his = submit(
        people["dave"],
        "a.research",
        {"children": 1, "child_endpoint": "b.private"},
        parent_id=root.id,
    )
    assert_refused(run(his), "b.private")


# --- An agent's delegate_to: named by its owners in the approved generation ----------------


def test_delegate_to_a_target_its_owners_may_submit_to_works(make_endpoint, people):
    make_endpoint("a.agent", owners=["alice"], runner={**AGENT, "delegate_to": ["b.private"]})
    make_endpoint("b.private", owners=["bob"], submitters={"groups": ["owners:a.agent"]})

    # Carol herself may not submit to b.private; the agent's owners named it
    # and may.
    parent = run(submit(people["carol"], "a.agent", {"prompt": "steps delegate-to b.private hi"}))

    assert parent.state == "waiting", parent.error
    [child] = children_of(parent)
    assert child.endpoint.address == "b.private" and child.input == {"text": "hi"}


def test_delegate_to_a_target_its_owners_may_not_submit_to_is_refused(make_endpoint, people):
    make_endpoint("a.agent", owners=["alice"], runner={**AGENT, "delegate_to": ["b.private"]})
    make_endpoint("b.private", owners=["bob"], submitters=OWNERS_ONLY)

    parent = run(submit(people["carol"], "a.agent", {"prompt": "steps delegate-to b.private hi"}))

    assert_refused(parent, "b.private")
    assert_available(lambda: submit(people["bob"], "b.private", {}))


def test_owners_rights_count_only_for_targets_they_named(make_endpoint, people):
    """An agent with no ``delegate_to`` (any target, its runner's choice):
    its owners may submit to b.private, but did not name it."""
    make_endpoint("a.agent", owners=["alice"], runner=AGENT)
    make_endpoint("b.private", owners=["bob"], submitters={"users": ["alice"]})

    parent = run(submit(people["carol"], "a.agent", {"prompt": "steps delegate-to b.private hi"}))

    assert_refused(parent, "b.private")


def test_every_owner_must_be_allowed(make_endpoint, people):
    """Co-owners share the agent's delegations: one owner's own right to
    submit there is not the others'."""
    make_endpoint(
        "a.agent", owners=["alice", "mallory"], runner={**AGENT, "delegate_to": ["b.private"]}
    )
    make_endpoint("b.private", owners=["bob"], submitters={"users": ["alice"]})

    parent = run(submit(people["carol"], "a.agent", {"prompt": "steps delegate-to b.private hi"}))

    assert_refused(parent, "b.private")


def test_a_later_round_is_checked_too(make_endpoint, people):
    """The second round of an exchange (admitted by a callback's turn) is
    the same rule: refused, the exchange fails ``forbidden``, nothing new."""
    make_endpoint("c.open")
    make_endpoint("a.agent", owners=["alice"], runner=AGENT)
    make_endpoint("b.private", owners=["bob"], submitters=OWNERS_ONLY)
    parent = run(
        submit(
            people["carol"],
            "a.agent",
            {"prompt": "steps delegate-to c.open x | delegate-to b.private y"},
        )
    )
    assert parent.state == "waiting", parent.error
    [first] = children_of(parent)
    run(first)
    [callback] = Ticket.objects.filter(callback_for=first)
    run(callback)
    parent.refresh_from_db()
    assert parent.state == "failed", parent.error
    assert parent.error["code"] == "forbidden" and "b.private" in parent.error["detail"]
    assert [c.endpoint.address for c in children_of(parent)] == ["c.open"]
    assert not Ticket.objects.filter(endpoint__address="b.private").exists()
