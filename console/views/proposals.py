"""A change proposal's page and its review. Only the endpoint's owners and
staff see a proposal or act on it (404 to anyone else); the service checks
again, and refuses a review whose endpoint moved on since the proposal
(``stale_generation``: the page shows what changed)."""

from __future__ import annotations

from django.urls import reverse
from django.views.decorators.http import require_POST

from endpoints import proposals

from ..forms import ReviewForm
from ..selectors import proposals as selectors
from .common import act, login_required, page


@login_required
def proposal_list(request):
    context = selectors.proposal_list_page(
        user=request.user, state=request.GET.get("state", "").strip()
    )
    return page(
        request,
        "console/proposal_list.html",
        {"section": "proposals", **context},
        region="table",
        status=400 if context["error"] else 200,
    )


def _proposal_page(request, proposal_id, *, form=None):
    proposal = selectors.visible_proposal(proposal_id, user=request.user)
    return page(
        request,
        "console/proposal_detail.html",
        {
            "section": "proposals",
            **selectors.proposal_page(proposal, user=request.user),
            # A refusal shows in the form (``act`` adds it as its error).
            "review_form": form or ReviewForm(prefix="review"),
        },
    )


@login_required
def proposal_detail(request, proposal_id):
    return _proposal_page(request, proposal_id)


@login_required
@require_POST
def proposal_review(request, proposal_id):
    proposal = selectors.visible_proposal(proposal_id, user=request.user)
    form = ReviewForm(request.POST, prefix="review")

    def done(review):
        if review.generation:
            return f"Approved: generation {review.generation} is live."
        return "Rejected."

    return act(
        request,
        lambda: proposals.review_proposal(
            proposal_id=proposal.id,
            user=request.user,
            approve=request.POST.get("verdict") == "approve",
            reason=form.cleaned_data["reason"],
        ),
        form=form,
        done=done,
        # Read again: after a stale_generation the page shows what changed since.
        refused=lambda _: _proposal_page(request, proposal.id, form=form),
        then=reverse("proposal_detail", args=[proposal.id]),
    )
