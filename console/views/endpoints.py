"""The endpoint list and an endpoint's page, with its actions: pause and
resume, an agent's tool-call approvals, and governed change (propose a
change, propose a rollback). Each action is one service call through
``act``; the services check again who may."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from endpoints import proposals
from runtime import services as runtime_services
from runtime.agents.services import decide_tool_call

from ..forms import ChangeForm, RollbackForm
from ..selectors import endpoints as selectors
from .common import act, login_required, page


@login_required
def endpoint_list(request):
    context = selectors.endpoint_list_page(user=request.user)
    return page(
        request, "console/endpoint_list.html", {"section": "endpoints", **context}, region="table"
    )


def _context(request, endpoint) -> dict:
    return {
        "section": "endpoints",
        **selectors.endpoint_page(endpoint, user=request.user, span=request.GET.get("range")),
    }


def _governance(request, endpoint, *, change_form=None, error: str | None = None) -> dict:
    """The governance part of the page (outside its live region), with the
    form to propose a change, for the endpoint's owners and staff."""
    governance = selectors.governance(endpoint, user=request.user)
    if governance:
        governance["change_form"] = change_form or ChangeForm.for_endpoint(endpoint)
        governance["governance_error"] = error
    return governance


@login_required
def endpoint_detail(request, address):
    """The endpoint page: its live region and, outside it, its governed
    change (generations, outcomes, proposals)."""
    endpoint = selectors.get_endpoint(address)
    if endpoint.address != address:  # an alias: show the canonical page
        return redirect("endpoint_detail", address=endpoint.address)
    context = _context(request, endpoint)
    if not (request.htmx and not request.htmx.history_restore_request):
        context.update(_governance(request, endpoint))  # not in the live region
    return page(request, "console/endpoint_detail.html", context, region="live")


def _endpoint_page(request, endpoint, **governance):
    """The whole page again, for a refused action (``act`` answers 422)."""
    context = _context(request, endpoint)
    context.update(_governance(request, endpoint, **governance))
    return page(request, "console/endpoint_detail.html", context)


def _refused_with_notice(request, endpoint):
    """A refusal shown as the page's notice, for actions whose forms have no
    error slot of their own."""

    def refused(detail):
        messages.error(request, detail)
        return _endpoint_page(request, endpoint)

    return refused


@login_required
@require_POST
def endpoint_pause(request, address):
    """Pause or resume (``action``) as the API does: the endpoint's owners and
    staff, with a reason; the service decides and records the event."""
    endpoint = selectors.get_endpoint(address)
    if not selectors.may_pause(endpoint, user=request.user):
        raise PermissionDenied("only the endpoint's owners may pause or resume it")
    resume = request.POST.get("action") == "resume"
    change = runtime_services.resume_endpoint if resume else runtime_services.pause_endpoint

    def done(result):
        _, changed = result
        if not changed:
            return messages.INFO, "It was already " + ("running." if resume else "paused.")
        if resume:
            return "Resumed: its queued tickets start again, oldest first."
        return "Paused: nothing new starts; a running turn finishes on its own."

    return act(
        request,
        lambda: change(
            address=endpoint.address, user=request.user, reason=request.POST.get("reason", "")
        ),
        done=done,
        refused=_refused_with_notice(request, endpoint),
        then=reverse("endpoint_detail", args=[endpoint.address]),
    )


@login_required
@require_POST
def agent_approval(request, address, ticket_id, call_id):
    """An owner approves or denies a pending tool call (the API's decision,
    from the endpoint page); the service checks who may. A call that is not
    waiting is 404."""
    endpoint = selectors.get_endpoint(address)

    def done(decided):
        verb = "approved" if decided["approved"] else "denied"
        return f"Call {call_id} {verb}; the agent resumes in a new turn."

    return act(
        request,
        lambda: decide_tool_call(
            address=endpoint.address,
            ticket_id=str(ticket_id),
            call_id=call_id,
            approve=request.POST.get("decision") == "approve",
            reason=request.POST.get("reason", ""),
            user=request.user,
        ),
        done=done,
        refused=_refused_with_notice(request, endpoint),
        then=reverse("endpoint_detail", args=[endpoint.address]),
        unknown_is_404=True,
    )


@login_required
@require_POST
def endpoint_propose(request, address):
    endpoint = selectors.governed_endpoint(address, user=request.user)
    form = ChangeForm(request.POST, prefix="change")
    return act(
        request,
        lambda: proposals.propose_change(
            address=endpoint.address,
            user=request.user,
            base_generation=form.cleaned_data["generation"],
            changes=form.changes(endpoint),
            reason=form.cleaned_data["reason"],
        ),
        form=form,
        done="Change proposed: another owner or staff reviews it.",
        refused=lambda _: _endpoint_page(request, endpoint, change_form=form),
        then=lambda proposal: reverse("proposal_detail", args=[proposal.id]),
    )


@login_required
@require_POST
def endpoint_rollback(request, address):
    endpoint = selectors.governed_endpoint(address, user=request.user)
    form = RollbackForm(request.POST)
    return act(
        request,
        lambda: proposals.propose_rollback(
            address=endpoint.address,
            user=request.user,
            to_generation=form.cleaned_data["to_generation"],
            base_generation=form.cleaned_data["generation"],
            reason=form.cleaned_data["reason"],
        ),
        form=form,
        done=lambda proposal: (
            f"Rollback to generation {proposal.restores} proposed: it needs a review."
        ),
        refused=lambda detail: _endpoint_page(
            request, endpoint, error=detail or "a rollback needs a reason"
        ),
        then=lambda proposal: reverse("proposal_detail", args=[proposal.id]),
    )
