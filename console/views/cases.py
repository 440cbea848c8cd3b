"""Recovery: the case list, a case's page and its owner's actions (inspect,
decide, write the lesson, propose a change from it, stop the process), and
the lesson list. Only the endpoint's owners and staff see a case (404 to
anyone else); each action is one service call through ``act``, which checks
again."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from core.errors import Invalid
from recovery import services as recovery_services

from ..forms import DecisionForm, LessonProposalMixin, LessonWithProposalForm
from ..selectors import cases as selectors
from ..templatetags.workertags import stop_process_form
from .common import act, login_required, page


@login_required
def case_list(request):
    context = selectors.case_list_page(
        user=request.user, state=request.GET.get("state", "").strip()
    )
    return page(
        request,
        "console/case_list.html",
        {"section": "recovery", **context},
        region="table",
        status=400 if context["error"] else 200,
    )


def _casework(
    request,
    case_id,
    *,
    decision_form: DecisionForm | None = None,
    lesson_form: LessonWithProposalForm | None = None,
    inspect_error: str | None = None,
) -> HttpResponse:
    """The case's page (its ``casework`` region for htmx), read afresh: an
    action has just changed the case. Its owners get the forms, with what a
    refused one was given."""
    case = selectors.get_case(case_id, user=request.user)
    context = {"section": "recovery", **selectors.case_page(case, user=request.user)}
    if context["can_act"]:  # forms exist only for owners; the POST views check again
        context["decision_form"] = decision_form or DecisionForm(
            inspections=selectors.case_inspections(case.id),
            prefix="decision",
            budget_cap=case.endpoint.turn_budget_s,
            initial={"rerun_input": json.dumps(case.ticket.input, indent=2, sort_keys=True)},
        )
        context["lesson_form"] = lesson_form or LessonWithProposalForm(
            prefix="lesson", initial={"proposal_generation": case.endpoint.generation}
        )
        # After the lesson: a change proposed from it (budget or notes).
        context["propose_form"] = LessonProposalMixin(
            prefix="propose", initial={"proposal_generation": case.endpoint.generation}
        )
        context["inspect_error"] = inspect_error
    return page(request, "console/case_detail.html", context, region="casework")


def _case_action(request, case, service, *, done, refused, form=None) -> HttpResponse:
    """``act`` for an action on the case's page: done, its casework region
    (htmx) or the page again."""
    return act(
        request,
        service,
        form=form,
        done=done,
        refused=refused,
        region=lambda _: _casework(request, case.id),
        then=reverse("case_detail", args=[case.id]),
    )


@login_required
def case_detail(request, case_id):
    return _casework(request, case_id)


@login_required
@require_POST
def case_inspect(request, case_id):
    case = selectors.case_for_owner(case_id, user=request.user)
    return _case_action(
        request,
        case,
        lambda: recovery_services.inspect_case(case_id=case.id, user=request.user),
        done=lambda inspection: f"Inspection taken: sha256 {inspection.sha256[:16]}…",
        refused=lambda detail: _casework(request, case.id, inspect_error=detail),
    )


def _rerun_changes(data: dict) -> dict:
    """The re-run's input and budget, for authorize_rerun only: the fields
    are prefilled for it and mean nothing to the other actions."""
    if data["action"] != "authorize_rerun":
        return {}
    return {"rerun_input": data["rerun_input"], "rerun_budget_s": data["rerun_budget_s"]}


@login_required
@require_POST
def case_decide(request, case_id):
    case = selectors.case_for_owner(case_id, user=request.user)
    form = DecisionForm(
        request.POST,
        inspections=selectors.case_inspections(case.id),
        prefix="decision",
        budget_cap=case.endpoint.turn_budget_s,
    )
    return _case_action(
        request,
        case,
        lambda: recovery_services.decide(
            case_id=case.id,
            user=request.user,
            action=form.cleaned_data["action"],
            inspection_id=form.cleaned_data["inspection"].id,
            rationale=form.cleaned_data["rationale"],
            evidence=form.cleaned_data["evidence"],
            **_rerun_changes(form.cleaned_data),
        ),
        form=form,
        done=lambda decision: f"Decision recorded: {decision.action}.",
        refused=lambda _: _casework(request, case.id, decision_form=form),
    )


@login_required
@require_POST
def case_lesson(request, case_id):
    case = selectors.case_for_owner(case_id, user=request.user)
    form = LessonWithProposalForm(request.POST, prefix="lesson")
    return _case_action(
        request,
        case,
        lambda: recovery_services.write_lesson(
            case_id=case.id, user=request.user, proposal=form.proposal(), **form.lesson_fields()
        ),
        form=form,
        done="Lesson written.",
        refused=lambda _: _casework(request, case.id, lesson_form=form),
    )


def _refused_with_notice(request, case):
    """A refusal shown as the page's notice, for the actions outside the
    casework region (a proposal from the lesson, stopping the process)."""

    def refused(detail):
        messages.error(request, detail)
        return _casework(request, case.id)

    return refused


@login_required
@require_POST
def case_propose(request, case_id):
    """A change proposed from a closed case's lesson: a turn budget or notes."""
    case = selectors.get_case(case_id, user=request.user)
    form = LessonProposalMixin(request.POST, prefix="propose")

    def propose():
        if not (form.is_valid() and form.proposal()):
            raise Invalid("propose a turn budget or notes for the next run")
        return recovery_services.propose_from_lesson(
            case_id=case.id, user=request.user, proposal=form.proposal()
        )

    return act(
        request,
        propose,
        done="Change proposed from the lesson.",
        refused=_refused_with_notice(request, case),
        then=lambda proposal: reverse("proposal_detail", args=[proposal.id]),
    )


@login_required
@require_POST
def case_stop_process(request, case_id):
    """The owner's "stop the process" (recovery.services.stop_process)."""
    case = selectors.case_for_owner(case_id, user=request.user)
    return act(
        request,
        lambda: recovery_services.stop_process(
            case_id=case.id, user=request.user, rationale=request.POST.get("rationale")
        ),
        done="Stop requested: the worker on that host stops its process.",
        refused=_refused_with_notice(request, case),
        then=reverse("case_detail", args=[case.id]),
    )


@login_required
def case_stop_panel(request, case_id):
    """The case page's "Worker process" panel alone: it polls this while a
    stop is requested, so the page says what became of the process once the
    worker reports (or a sweep closes the stop), without a reload."""
    case = selectors.get_case(case_id, user=request.user)
    context = stop_process_form({"csrf_token": get_token(request)}, case)
    response = render(request, "console/_stop_process.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


@login_required
def lesson_list(request):
    context = selectors.lesson_list_page(user=request.user)
    return page(request, "console/lesson_list.html", {"section": "lessons", **context})
