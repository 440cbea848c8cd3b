"""Console views of governed change: propose a change of an endpoint (from
its page or from a lesson), review it, roll back, and see each generation's
outcomes. Only the endpoint's owners and staff see or act: to anyone else
the endpoint's governance and its proposals do not exist (404). Each view
calls one service; the services check again."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from core.errors import DomainError, NotFound, StaleGeneration
from endpoints import generation_selectors, proposals
from endpoints.models import ChangeProposal
from endpoints.selectors import is_owner
from recovery import services as recovery_services

from . import selectors
from .forms import ChangeForm, ReviewForm, RollbackForm
from .views import REFUSED, endpoint_context, login_required, page


@login_required
def endpoint_detail(request, address):
    """The endpoint page: its live region (``views.endpoint_context``) and,
    outside it, its governed change (generations, outcomes, proposals)."""
    endpoint = selectors.get_endpoint(address)
    if endpoint.address != address:  # an alias: show the canonical page
        return redirect("endpoint_detail", address=endpoint.address)
    context = endpoint_context(request, endpoint)
    if not (request.htmx and not request.htmx.history_restore_request):
        context.update(governance_context(request, endpoint))  # not in the live region
    return page(request, "console/endpoint_detail.html", context, region="live")


def governance_context(request, endpoint, *, change_form=None, error: str | None = None) -> dict:
    """What the endpoint page shows its owners and staff: the generations
    (newest first, with diffs), the current one's outcomes beside the one
    before, proposals, routes, and the form to propose a change."""
    if not is_owner(request.user, endpoint):
        return {}
    return {
        "governs": True,
        "generations": generation_selectors.generations_of(endpoint, limit=20),
        "outcomes": generation_selectors.side_by_side(endpoint),
        "proposals": [
            generation_selectors.proposal_payload(p, user=request.user)
            for p in generation_selectors.proposals_of(endpoint, limit=20)
        ],
        "routes": [
            generation_selectors.route_payload(r)
            for r in generation_selectors.routes_of(endpoint, limit=20)
        ],
        "change_form": change_form or ChangeForm.for_endpoint(endpoint),
        "governance_error": error,
    }


def _governed(request, address):
    try:
        return proposals.governed_endpoint(address, request.user)
    except NotFound as exc:
        raise Http404(exc.detail) from None


def _endpoint_page(request, endpoint, *, status: int, **kwargs):
    context = endpoint_context(request, endpoint)
    context.update(governance_context(request, endpoint, **kwargs))
    return page(request, "console/endpoint_detail.html", context, status=status)


@login_required
@require_POST
def endpoint_propose(request, address):
    endpoint = _governed(request, address)
    form = ChangeForm(request.POST, prefix="change")
    if form.is_valid():
        try:
            proposal = proposals.propose_change(
                address=endpoint.address,
                user=request.user,
                base_generation=form.cleaned_data["generation"],
                changes=form.changes(endpoint),
                reason=form.cleaned_data["reason"],
            )
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, "Change proposed: another owner or staff reviews it.")
            return redirect("proposal_detail", proposal_id=proposal.id)
    return _endpoint_page(request, endpoint, status=REFUSED, change_form=form)


@login_required
@require_POST
def endpoint_rollback(request, address):
    endpoint = _governed(request, address)
    form = RollbackForm(request.POST)
    if form.is_valid():
        try:
            proposal = proposals.propose_rollback(
                address=endpoint.address,
                user=request.user,
                to_generation=form.cleaned_data["to_generation"],
                base_generation=form.cleaned_data["generation"],
                reason=form.cleaned_data["reason"],
            )
        except DomainError as exc:
            return _endpoint_page(request, endpoint, status=REFUSED, error=exc.detail)
        messages.success(
            request, f"Rollback to generation {proposal.restores} proposed: it needs a review."
        )
        return redirect("proposal_detail", proposal_id=proposal.id)
    return _endpoint_page(request, endpoint, status=REFUSED, error="a rollback needs a reason")


def _proposal(request, proposal_id) -> ChangeProposal:
    try:
        return proposals.visible_proposal(proposal_id, request.user)
    except NotFound as exc:
        raise Http404(exc.detail) from None


def _proposal_page(request, proposal, *, status: int = 200, form=None, error=None):
    body = generation_selectors.proposal_detail(proposal, user=request.user)
    origin = proposal.origin or {}
    return page(
        request,
        "console/proposal_detail.html",
        {
            "section": "endpoints",
            "proposal": proposal,
            "p": body,
            "origin_case": origin.get("case"),
            "origin_lesson": origin.get("lesson"),
            "review_form": form or ReviewForm(prefix="review"),
            "review_error": error,
        },
        status=status,
    )


@login_required
def proposal_detail(request, proposal_id):
    return _proposal_page(request, _proposal(request, proposal_id))


@login_required
@require_POST
def proposal_review(request, proposal_id):
    proposal = _proposal(request, proposal_id)
    form = ReviewForm(request.POST, prefix="review")
    if not form.is_valid():
        return _proposal_page(request, proposal, status=REFUSED, form=form)
    approve = request.POST.get("verdict") == "approve"
    try:
        review = proposals.review_proposal(
            proposal_id=proposal.id,
            user=request.user,
            approve=approve,
            reason=form.cleaned_data["reason"],
        )
    except StaleGeneration as exc:
        # The reviewer sees what changed since (the page's "since" panel).
        return _proposal_page(request, _proposal(request, proposal.id), status=REFUSED,
                              form=form, error=exc.detail)  # fmt: skip
    except DomainError as exc:
        return _proposal_page(request, proposal, status=REFUSED, form=form, error=exc.detail)
    if review.generation:
        messages.success(request, f"Approved: generation {review.generation} is live.")
    else:
        messages.success(request, "Rejected.")
    return redirect("proposal_detail", proposal_id=proposal.id)


@login_required
@require_POST
def case_propose(request, case_id):
    """A change proposed from a closed case's lesson."""
    from .forms import LessonProposalMixin

    case = selectors.get_case(case_id, user=request.user)
    form = LessonProposalMixin(request.POST, prefix="propose")
    error = None
    if form.is_valid() and form.proposal():
        try:
            proposal = recovery_services.propose_from_lesson(
                case_id=case.id, user=request.user, proposal=form.proposal()
            )
        except DomainError as exc:
            error = exc.detail
        else:
            messages.success(request, "Change proposed from the lesson.")
            return redirect("proposal_detail", proposal_id=proposal.id)
    else:
        error = "propose a turn budget or notes for the next run"
    messages.error(request, error)
    return redirect("case_detail", case_id=case.id)
