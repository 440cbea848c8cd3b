"""The ticket list, bulk actions, a ticket's page and its actions (cancel,
approve, retry, the obligation). Each action is one service call through
``act``: refused, the ticket's region again with the reason (422); done,
the region (htmx) or a redirect to the page."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.errors import DomainError, Invalid
from runtime import services as runtime_services
from tickets import delivery, obligations, retry

from ..forms import retry_changes, utc_param
from ..selectors import tickets as selectors
from .common import act, login_required, page

BULK_ACTIONS = {"approve", "cancel", "retry"}
BULK_VERBS = {
    "approve": "approved",
    "cancel": "cancelled (or asked to stop)",
    "retry": "retried as new tickets",
}
BULK_MAX = selectors.TICKETS_PAGE
REASON_CHARS = 2000


@login_required
def ticket_list(request):
    context = selectors.ticket_list_page(user=request.user, params=request.GET)
    return page(
        request,
        "console/ticket_list.html",
        {"section": "tickets", **context},
        region="table",
        status=400 if context["error"] else 200,
    )


@login_required
@require_POST
def ticket_bulk(request):
    """Bulk approve, cancel or retry of the selected tickets, with a required
    reason. One service call per ticket, each its own transaction, with the
    same rules as the API: a ticket the user may not see counts as not found,
    approving needs an owner; a refusal for one ticket does not stop the rest,
    and the page says what happened to each."""
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "").strip()
    raw_ids = request.POST.getlist("ticket")
    back = request.POST.get("next", "")
    if not back.startswith("/tickets/"):
        back = reverse("ticket_list")
    problems = []
    if action not in BULK_ACTIONS:
        problems.append("Choose approve, cancel or retry.")
    if not reason:
        problems.append("A reason is required: it is recorded on every ticket's timeline.")
    if not raw_ids:
        problems.append("Select at least one ticket.")
    if len(raw_ids) > BULK_MAX:
        problems.append(f"Select at most {BULK_MAX} tickets at once.")
    if len(reason) > REASON_CHARS:
        problems.append(f"The reason is at most {REASON_CHARS} characters.")
    new_input = budget = None
    if action == "retry":
        try:
            new_input, budget = retry_changes(request.POST)
        except Invalid as exc:
            problems.append(exc.detail)
    if problems:
        for problem in problems:
            messages.error(request, problem)
        return redirect(back)
    done, refused = 0, []
    for raw in raw_ids:
        try:
            ticket = selectors.visible_ticket(raw, user=request.user)
        except Http404:
            refused.append(f"…{raw[-8:]}: not found")
            continue
        try:
            if action == "approve":
                delivery.approve_ticket(ticket_id=ticket.id, user=request.user, reason=reason)
            elif action == "retry":
                retry.retry_ticket(
                    ticket_id=ticket.id,
                    user=request.user,
                    reason=reason,
                    input=new_input,
                    budget_s=budget,
                )
            else:
                runtime_services.cancel_ticket(
                    ticket_id=ticket.id, actor=f"user:{request.user.username}", reason=reason
                )
        except DomainError as exc:
            refused.append(f"…{str(ticket.id)[-8:]}: {exc.detail}")
        else:
            done += 1
    verb = BULK_VERBS[action]
    if done:
        messages.success(request, f"{done} ticket{'s' if done != 1 else ''} {verb}.")
    for line in refused:
        messages.error(request, f"Refused {line}")
    return redirect(back)


def _ticket_region(request, ticket_id, *, retry_form: dict | None = None, **errors):
    """The ticket's page (its region for htmx), with a refused action's
    reason under its form (``approve_error``, ``cancel_error``, ...)."""
    context = {"section": "tickets", **selectors.ticket_page(ticket_id, user=request.user)}
    context.update(errors)
    if retry_form is not None:  # what the user typed, kept when refused
        context["retry_form"] = retry_form
    return page(request, "console/ticket_detail.html", context, region="ticket")


@login_required
def ticket_detail(request, ticket_id):
    return _ticket_region(request, ticket_id)


def _ticket_action(request, ticket, service, *, done: str, error: str, **kwargs):
    """``act`` for an action on the ticket's page: refused, the region with
    the reason as ``error``; done, the region or the page again."""
    return act(
        request,
        service,
        done=done,
        refused=lambda detail: _ticket_region(request, ticket.id, **{error: detail}),
        region=lambda _: _ticket_region(request, ticket.id),
        then=reverse("ticket_detail", args=[ticket.id]),
        **kwargs,
    )


@login_required
@require_POST
def ticket_approve(request, ticket_id):
    ticket = selectors.visible_ticket(ticket_id, user=request.user)
    if not selectors.may_manage(ticket, user=request.user):
        raise PermissionDenied("only the endpoint's owners may approve its results")
    return _ticket_action(
        request,
        ticket,
        lambda: delivery.approve_ticket(ticket_id=ticket.id, user=request.user),
        done="Result approved; delivery released.",
        error="approve_error",
    )


@login_required
@require_POST
def ticket_cancel(request, ticket_id):
    """Cancel as the API does (submitter, owners, staff: whoever may see the
    ticket), with the reason the form asks for kept on the timeline."""
    ticket = selectors.visible_ticket(ticket_id, user=request.user)
    reason = request.POST.get("reason", "").strip()

    def cancel():
        if not reason:
            raise Invalid("A reason is required.")
        return runtime_services.cancel_ticket(
            ticket_id=ticket.id,
            actor=f"user:{request.user.username}",
            reason=reason[:REASON_CHARS],
        )

    return _ticket_action(request, ticket, cancel, done="Cancel recorded.", error="cancel_error")


@login_required
@require_POST
def ticket_retry(request, ticket_id):
    """Retry a failed, cancelled or orphaned ticket as a new one (with the
    input and budget the form gives, or the original's); the service decides
    who may and refuses with the reason, shown in the form with what the
    user typed. Done, the new ticket's page (a redirect even for htmx: the
    region on screen is the old ticket's)."""
    ticket = selectors.visible_ticket(ticket_id, user=request.user)
    typed = {"input": request.POST.get("input", ""), "budget_s": request.POST.get("budget_s", "")}

    def retry_it():
        new_input, budget = retry_changes(request.POST)
        return retry.retry_ticket(
            ticket_id=ticket.id,
            user=request.user,
            reason=request.POST.get("reason", ""),
            input=new_input,
            budget_s=budget,
        )

    return act(
        request,
        retry_it,
        done=lambda new: f"Retried as ticket {new.id}.",
        refused=lambda detail: _ticket_region(
            request, ticket.id, retry_error=detail, retry_form=typed
        ),
        then=lambda new: reverse("ticket_detail", args=[new.id]),
    )


@login_required
@require_POST
def ticket_obligation(request, ticket_id):
    """Owners set the next-update time and posture note, or close the
    obligation, through tickets.obligations (which checks again)."""
    ticket = selectors.visible_ticket(ticket_id, user=request.user)
    if not selectors.may_manage(ticket, user=request.user):
        raise PermissionDenied("only the endpoint's owners may manage its obligations")
    note = request.POST.get("note", "").strip() or None
    raw_due = request.POST.get("next_update_at", "").strip()
    closing = request.POST.get("action") == "close"

    def manage():
        due = utc_param(raw_due, "next update") if raw_due else None
        if closing:
            return obligations.close_obligation(
                ticket_id=ticket.id, user=request.user, note=note or ""
            )
        return obligations.update_obligation(
            ticket_id=ticket.id, user=request.user, next_update_at=due, note=note
        )

    return _ticket_action(
        request,
        ticket,
        manage,
        done="Obligation closed." if closing else "Obligation updated.",
        error="obligation_error",
    )
