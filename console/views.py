"""Operator console: plain function views.

Reads go through selectors, writes through one service call each; no view
sets a state field. Authorisation lives here, in the view, never only in a
template: htmx can ask for any region, and a POST can come from anywhere.

Each page is one template; its live region is a ``{% partialdef %}`` that
the view renders alone (``page.html#region``) when htmx asks for it.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required as django_login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from core.errors import DomainError, Invalid, InvalidSearch, NotFound
from endpoints import generation_selectors
from endpoints.selectors import is_owner, resolve_endpoint, sees_configuration
from health.checks import readiness
from recovery import selectors as recovery_selectors
from recovery import services as recovery_services
from recovery.models import CaseState
from runtime import services as runtime_services
from runtime.selectors import endpoint_payload
from tickets import delivery, obligations, retry
from tickets import selectors as ticket_selectors
from tickets.models import DeliveryState, ObligationState, TicketState

from . import preferences, selectors
from .forms import DecisionForm, LessonProposalMixin, LessonWithProposalForm

TICKETS_PAGE = 50
CANCELLABLE = {TicketState.QUEUED, TicketState.WAITING, TicketState.RUNNING}

# A submission the service refused (or the form rejected) is answered 422 with
# the reason in the form's region; htmx is configured in base.html to swap 422.
REFUSED = 422


def login_required(view):
    """Django's ``login_required``, except for htmx: a region refresh whose
    session has ended would follow the redirect and swap the whole login page
    into the region. It gets a client-side redirect instead, back to the page
    the user was looking at after logging in."""
    guarded = django_login_required(view)

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.htmx and not request.user.is_authenticated:
            back = request.htmx.current_url_abs_path or request.get_full_path()
            return HttpResponseClientRedirect(redirect_to_login(back)["Location"])
        return guarded(request, *args, **kwargs)

    return wrapper


def page(
    request: HttpRequest,
    template: str,
    context: dict,
    *,
    region: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """The whole page, or only ``region`` when htmx swaps it in. A history
    restore (back button after the cache expired) needs the whole page. The
    flash messages ride along as an out-of-band swap so they show at once."""
    if region and request.htmx and not request.htmx.history_restore_request:
        response = render(request, f"{template}#{region}", context, status=status)
        # Only when there is something to say: a live poll must not wipe the
        # notice an action just put up.
        if len(messages.get_messages(request)):
            notices = render_to_string("console/_messages.html", {"oob": True}, request=request)
            response.write(notices)
    else:
        response = render(request, template, context, status=status)
    # The same URL answers with a region or a page: caches must keep both.
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- Dashboard ---------------------------------------------------------------------------------


@login_required
def dashboard(request):
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    counts = selectors.ticket_state_counts(user=request.user)
    awaiting, awaiting_more = ticket_selectors.awaiting_approval(user=request.user)
    return page(
        request,
        "console/dashboard.html",
        {
            "section": "dashboard",
            "counts": counts,
            "count_cap": selectors.STATE_COUNT_CAP,
            "quarantined": selectors.quarantined_endpoints(user=request.user),
            "paused": selectors.paused_endpoints(user=request.user),
            "overdue": selectors.overdue_obligations(user=request.user),
            "recent": selectors.recent_tickets(user=request.user),
            "hour": selectors.last_hour(user=request.user, span=request.GET.get("range")),
            "awaiting": awaiting,
            "awaiting_more": awaiting_more,
            "review_queue": [
                generation_selectors.proposal_payload(p, user=request.user)
                for p in generation_selectors.review_queue(request.user, limit=20)
            ],
            "capacity": selectors.capacity_flags(),
            # Database, broker and sweepers, as /readyz sees them.
            "readiness": readiness(probe_database=False),
            "live_token": live_token,
        },
        region="live",
    )


# --- Tickets -----------------------------------------------------------------------------------


DELIVERY_FILTERS = [
    (DeliveryState.AWAITING_APPROVAL, "awaiting approval"),
    (DeliveryState.PENDING, "pending"),
    (DeliveryState.ATTEMPTED, "attempted"),
    (DeliveryState.FAILED, "failed"),
    (DeliveryState.DELIVERED, "delivered"),
]


def _utc_param(raw: str, name: str) -> datetime | None:
    """A time filter typed as UTC (``YYYY-MM-DD HH:MM[:SS]``, a ``T`` or a
    trailing ``Z`` accepted); a naive value is UTC, never local time."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(
            f"{name}: {raw!r} is not a date and time (UTC, like 2026-11-30 14:05)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@login_required
def ticket_list(request):
    filters = {
        key: request.GET.get(key, "").strip()
        for key in ("q", "endpoint", "state", "delivery", "since", "until", "trace_id")
    }
    # The trace filter of earlier links is the search box now.
    if filters["trace_id"] and not filters["q"]:
        filters["q"] = filters["trace_id"]
    cursor = request.GET.get("cursor", "").strip() or None
    live_token = None if cursor else ticket_selectors.ledger_change_token()  # before the rows
    rows, next_cursor, error, search_error = [], None, None, False
    try:
        endpoint_id = resolve_endpoint(filters["endpoint"]).id if filters["endpoint"] else None
        rows, next_cursor = ticket_selectors.find_tickets(
            user=request.user,
            q=filters["q"],
            endpoint_id=endpoint_id,
            state=filters["state"] or None,
            delivery_state=filters["delivery"] or None,
            since=_utc_param(filters["since"], "since"),
            until=_utc_param(filters["until"], "until"),
            limit=TICKETS_PAGE,
            cursor=cursor,
        )
    except DomainError as exc:
        error = exc.detail
        search_error = exc.code == InvalidSearch.code
    return page(
        request,
        "console/ticket_list.html",
        {
            "section": "tickets",
            "filters": filters,
            "search_error": search_error,
            "tickets": rows,
            "cursor": cursor,
            "next_cursor": next_cursor,
            "error": error,
            "states": TicketState.values,
            "deliveries": DELIVERY_FILTERS,
            "endpoints": selectors.endpoint_choices(),
            "selectable": True,
            "live_token": live_token,
        },
        region="table",
        status=400 if error else 200,
    )


BULK_ACTIONS = {"approve", "cancel", "retry"}
BULK_VERBS = {
    "approve": "approved",
    "cancel": "cancelled (or asked to stop)",
    "retry": "retried as new tickets",
}


def _retry_changes(post) -> tuple[dict | None, int | None]:
    """The optional input and budget a retry form gives: blank means keep
    the ticket's input and the endpoint's budget. Invalid on bad JSON."""
    raw_input = post.get("input", "").strip()
    raw_budget = post.get("budget_s", "").strip()
    new_input = None
    if raw_input:
        try:
            new_input = json.loads(raw_input)
        except ValueError as exc:
            raise Invalid(f"the input is not JSON: {exc}") from None
        if not isinstance(new_input, dict):
            raise Invalid("the input must be a JSON object")
    budget = None
    if raw_budget:
        try:
            budget = int(raw_budget)
        except ValueError:
            raise Invalid("the budget is a whole number of seconds") from None
    return new_input, budget


BULK_MAX = TICKETS_PAGE


@login_required
@require_POST
def ticket_bulk(request):
    """Bulk approve or cancel of the selected tickets, with a required
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
    if len(reason) > 2000:
        problems.append("The reason is at most 2000 characters.")
    new_input = budget = None
    if action == "retry":
        try:
            new_input, budget = _retry_changes(request.POST)
        except Invalid as exc:
            problems.append(exc.detail)
    if problems:
        for problem in problems:
            messages.error(request, problem)
        return redirect(back)
    done, refused = 0, []
    for raw in raw_ids:
        try:
            ticket_id = uuid.UUID(raw)
            ticket = ticket_selectors.get_visible_ticket(ticket_id, user=request.user)
        except (ValueError, NotFound):
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


def _ticket_context(
    request,
    ticket_id: uuid.UUID,
    *,
    approve_error: str | None = None,
    obligation_error: str | None = None,
    cancel_error: str | None = None,
    retry_error: str | None = None,
    retry_form: dict | None = None,
) -> dict:
    live_token = ticket_selectors.change_token(ticket_id)  # before what it covers
    try:
        detail = selectors.ticket_detail(ticket_id, user=request.user)
    except NotFound:
        raise Http404("ticket not found") from None
    ticket = detail.ticket
    return {
        "section": "tickets",
        "t": detail,
        "ticket": ticket,
        "can_approve": ticket.delivery_state == DeliveryState.AWAITING_APPROVAL
        and is_owner(request.user, ticket.endpoint),
        "approve_error": approve_error,
        "requester_lacks": selectors.requester_lacks(ticket)
        if ticket.obligation_state == ObligationState.OPEN
        else None,
        "awaiting_pickup": selectors.awaiting_pickup(ticket),
        "can_manage_obligation": ticket.obligation_state == ObligationState.OPEN
        and is_owner(request.user, ticket.endpoint),
        "obligation_error": obligation_error,
        # Whoever sees a ticket may cancel it (API.md), while it can be.
        "can_cancel": ticket.state in CANCELLABLE and not ticket.cancel_requested_at,
        "open_case": recovery_selectors.visible_cases(request.user)
        .filter(ticket_id=ticket.id, state__in=[CaseState.OPEN, CaseState.DECIDED])
        .order_by("-opened_at")
        .first(),
        "cancel_error": cancel_error,
        # An owner, or the submitter for their own ticket, may retry it once.
        "can_retry": ticket.state in retry.RETRYABLE
        and not ticket.callback_for_id
        and not detail.payload["retry"]
        and (ticket.submitted_by_id == request.user.pk or is_owner(request.user, ticket.endpoint)),
        "retry_error": retry_error,
        # What the owner typed, kept when the service refuses it.
        "retry_form": retry_form
        or {"input": json.dumps(ticket.input, indent=2, sort_keys=True), "budget_s": ""},
        "live_token": live_token,
    }


def _visible_ticket(request, ticket_id):
    """404 for a ticket the user may not see, exactly as for an unknown one,
    before any check of what they want to do with it."""
    try:
        return ticket_selectors.get_visible_ticket(ticket_id, user=request.user)
    except NotFound:
        raise Http404("ticket not found") from None


@login_required
def ticket_detail(request, ticket_id):
    context = _ticket_context(request, ticket_id)
    return page(request, "console/ticket_detail.html", context, region="ticket")


@login_required
@require_POST
def ticket_approve(request, ticket_id):
    ticket = _visible_ticket(request, ticket_id)
    if not is_owner(request.user, ticket.endpoint):
        raise PermissionDenied("only the endpoint's owners may approve its results")
    try:
        delivery.approve_ticket(ticket_id=ticket.id, user=request.user)
    except DomainError as exc:
        context = _ticket_context(request, ticket.id, approve_error=exc.detail)
        return page(request, "console/ticket_detail.html", context, region="ticket", status=REFUSED)
    messages.success(request, "Result approved; delivery released.")
    if request.htmx:
        context = _ticket_context(request, ticket.id)
        return page(request, "console/ticket_detail.html", context, region="ticket")
    return redirect("ticket_detail", ticket_id=ticket.id)


@login_required
@require_POST
def ticket_cancel(request, ticket_id):
    """Cancel as the API does (submitter, owners, staff: whoever may see the
    ticket), with the reason the form asks for kept on the timeline."""
    ticket = _visible_ticket(request, ticket_id)
    reason = request.POST.get("reason", "").strip()
    if not reason:
        context = _ticket_context(request, ticket.id, cancel_error="A reason is required.")
        return page(request, "console/ticket_detail.html", context, region="ticket", status=REFUSED)
    try:
        runtime_services.cancel_ticket(
            ticket_id=ticket.id, actor=f"user:{request.user.username}", reason=reason[:2000]
        )
    except DomainError as exc:
        context = _ticket_context(request, ticket.id, cancel_error=exc.detail)
        return page(request, "console/ticket_detail.html", context, region="ticket", status=REFUSED)
    messages.success(request, "Cancel recorded.")
    if request.htmx:
        context = _ticket_context(request, ticket.id)
        return page(request, "console/ticket_detail.html", context, region="ticket")
    return redirect("ticket_detail", ticket_id=ticket.id)


@login_required
@require_POST
def ticket_retry(request, ticket_id):
    """Retry a failed, cancelled or orphaned ticket as a new one (with the
    input and budget the form gives, or the original's); the service decides
    who may and refuses with the reason, shown in the form."""
    ticket = _visible_ticket(request, ticket_id)
    form = {"input": request.POST.get("input", ""), "budget_s": request.POST.get("budget_s", "")}
    try:
        new_input, budget = _retry_changes(request.POST)
        new = retry.retry_ticket(
            ticket_id=ticket.id,
            user=request.user,
            reason=request.POST.get("reason", ""),
            input=new_input,
            budget_s=budget,
        )
    except DomainError as exc:
        context = _ticket_context(request, ticket.id, retry_error=exc.detail, retry_form=form)
        return page(request, "console/ticket_detail.html", context, region="ticket", status=REFUSED)
    messages.success(request, f"Retried as ticket {new.id}.")
    if request.htmx:
        return HttpResponseClientRedirect(reverse("ticket_detail", args=[new.id]))
    return redirect("ticket_detail", ticket_id=new.id)


@login_required
@require_POST
def ticket_obligation(request, ticket_id):
    """Owners set the next-update time and posture note, or close the
    obligation, through tickets.obligations (which checks again)."""
    ticket = _visible_ticket(request, ticket_id)
    if not is_owner(request.user, ticket.endpoint):
        raise PermissionDenied("only the endpoint's owners may manage its obligations")
    note = request.POST.get("note", "").strip() or None
    raw_due = request.POST.get("next_update_at", "").strip()
    try:
        due = _utc_param(raw_due, "next update") if raw_due else None
        if request.POST.get("action") == "close":
            obligations.close_obligation(ticket_id=ticket.id, user=request.user, note=note or "")
            done = "Obligation closed."
        else:
            obligations.update_obligation(
                ticket_id=ticket.id, user=request.user, next_update_at=due, note=note
            )
            done = "Obligation updated."
    except DomainError as exc:
        error = exc.detail
    else:
        messages.success(request, done)
        if request.htmx:
            context = _ticket_context(request, ticket.id)
            return page(request, "console/ticket_detail.html", context, region="ticket")
        return redirect("ticket_detail", ticket_id=ticket.id)
    context = _ticket_context(request, ticket.id, obligation_error=error)
    return page(request, "console/ticket_detail.html", context, region="ticket", status=REFUSED)


# --- Traces ------------------------------------------------------------------------------------


@login_required
def trace_detail(request, trace_id):
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    tree, rows = selectors.trace_tree(trace_id, user=request.user)
    return page(
        request,
        "console/trace_detail.html",
        {
            "section": "tickets",
            "trace_id": trace_id,
            "tree": tree,
            "rows": rows,
            "active": selectors.trace_active(rows),
            "waterfall": selectors.trace_waterfall(rows),
            "warned": any(r.warned for r in rows),
            "trace_soft_limit": settings.TRACE_SOFT_LIMIT,
            "trace_hard_limit": settings.TRACE_HARD_LIMIT,
            "live_token": live_token,
        },
        region="tree",
    )


# --- Endpoints ---------------------------------------------------------------------------------


@login_required
def endpoint_list(request):
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    return page(
        request,
        "console/endpoint_list.html",
        {
            "section": "endpoints",
            "endpoints": selectors.endpoint_rows(user=request.user),
            "live_token": live_token,
        },
        region="table",
    )


def endpoint_context(request, endpoint) -> dict:
    live_token = ticket_selectors.ledger_change_token()  # before what it covers
    holder = selectors.lock_holder(endpoint)
    span = selectors.chart_range(request.GET.get("range"))
    return {
        "section": "endpoints",
        "endpoint": endpoint,
        "e": endpoint_payload(endpoint, user=request.user),
        "sees_configuration": sees_configuration(request.user, endpoint),
        "can_see_cases": is_owner(request.user, endpoint),
        "can_pause": is_owner(request.user, endpoint),
        "pause_events": selectors.pause_events(endpoint, user=request.user),
        "holder": holder,
        "holder_visible": holder is not None
        and ticket_selectors.visible_tickets(request.user).filter(id=holder.ticket_id).exists(),
        "turns": selectors.recent_turns(endpoint, user=request.user),
        "hour": selectors.endpoint_hour(endpoint, span=span),
        "throughput": selectors.last_hour(user=request.user, span=span, endpoint=endpoint),
        "cases": selectors.endpoint_cases(endpoint, user=request.user),
        "live_token": live_token,
        **_agent_context(request, endpoint),
    }


@login_required
@require_POST
def endpoint_pause(request, address):
    """Pause or resume (``action``) as the API does: the endpoint's owners and
    staff, with a reason; the service decides and records the event."""
    endpoint = selectors.get_endpoint(address)
    if not is_owner(request.user, endpoint):
        raise PermissionDenied("only the endpoint's owners may pause or resume it")
    resume = request.POST.get("action") == "resume"
    act = runtime_services.resume_endpoint if resume else runtime_services.pause_endpoint
    try:
        _, changed = act(
            address=endpoint.address, user=request.user, reason=request.POST.get("reason", "")
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        if not changed:
            messages.info(request, "It was already " + ("running." if resume else "paused."))
        elif resume:
            messages.success(request, "Resumed: its queued tickets start again, oldest first.")
        else:
            messages.success(
                request, "Paused: nothing new starts; a running turn finishes on its own."
            )
    return redirect("endpoint_detail", address=endpoint.address)


CONSOLE_CONVERSATION_TURNS = 20


def _agent_context(request, endpoint) -> dict:
    """An agent endpoint's conversation and pending approvals: its owners
    (and staff) only; anyone else sees neither."""
    if endpoint.runner.get("kind") != "agent" or not is_owner(request.user, endpoint):
        return {}
    from runtime.agents import selectors as agent_selectors

    turns = agent_selectors.conversation(endpoint, limit=CONSOLE_CONVERSATION_TURNS)
    for turn in turns:
        turn["lines"] = agent_selectors.message_lines(turn["messages"])
    return {
        "agent": True,
        "conversation": turns,
        "approvals": agent_selectors.pending_approvals(endpoint),
    }


@login_required
@require_POST
def agent_approval(request, address, ticket_id, call_id):
    """An owner approves or denies a pending tool call (the API's decision,
    from the endpoint page); the service checks who may."""
    from runtime.agents.services import decide_tool_call

    endpoint = selectors.get_endpoint(address)
    approve = request.POST.get("decision") == "approve"
    try:
        decided = decide_tool_call(
            address=endpoint.address,
            ticket_id=str(ticket_id),
            call_id=call_id,
            approve=approve,
            reason=request.POST.get("reason", ""),
            user=request.user,
        )
    except NotFound as exc:
        raise Http404(exc.detail) from None
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        verb = "approved" if decided["approved"] else "denied"
        messages.success(request, f"Call {call_id} {verb}; the agent resumes in a new turn.")
    return redirect("endpoint_detail", address=endpoint.address)


# --- Recovery ----------------------------------------------------------------------------------


@login_required
def case_list(request):
    state = request.GET.get("state", "").strip()
    error, cases = None, []
    try:
        cases = recovery_selectors.list_cases(
            cases=recovery_selectors.visible_cases(request.user),
            state=state or None,
            limit=selectors.LIST_CAP,
        )
    except DomainError as exc:
        error = exc.detail
    return page(
        request,
        "console/case_list.html",
        {
            "section": "recovery",
            "cases": cases,
            "state": state,
            "states": CaseState.values,
            "error": error,
            "cap": selectors.LIST_CAP,
        },
        region="table",
        status=400 if error else 200,
    )


def _case_context(
    request,
    case,
    *,
    decision_form: DecisionForm | None = None,
    lesson_form: LessonWithProposalForm | None = None,
    inspect_error: str | None = None,
) -> dict:
    can_act = is_owner(request.user, case.endpoint)
    context = {
        "section": "recovery",
        "case": case,
        "d": selectors.case_detail(case),
        "can_act": can_act,
        # Another open case of the endpoint holds it quarantined once this
        # one is decided: name it, so the page does not dead-end.
        "holding_case": recovery_selectors.visible_cases(request.user)
        .filter(endpoint_id=case.endpoint_id, state=CaseState.OPEN)
        .exclude(id=case.id)
        .values_list("id", flat=True)
        .first(),
    }
    lesson = context["d"].lesson
    if lesson is not None:
        # The changes the lesson proposed, and once approved their outcomes
        # beside the generation before: did it help?
        context["lesson_proposals"] = [
            generation_selectors.proposal_detail(p, user=request.user)
            for p in generation_selectors.proposals_from_lesson(lesson.id)
        ]
    if can_act:  # forms exist only for owners; the POST views check again
        context["decision_form"] = decision_form or DecisionForm(
            inspections=selectors.case_inspections(case.id),
            prefix="decision",
            budget_cap=case.endpoint.turn_budget_s,
            initial={"rerun_input": json.dumps(case.ticket.input, indent=2, sort_keys=True)},
        )
        context["rerun_warning"] = selectors.rerun_warning(case)
        context["lesson_form"] = lesson_form or LessonWithProposalForm(
            prefix="lesson", initial={"proposal_generation": case.endpoint.generation}
        )
        # After the lesson: a change proposed from it (budget or notes).
        context["propose_form"] = LessonProposalMixin(
            prefix="propose", initial={"proposal_generation": case.endpoint.generation}
        )
        context["inspect_error"] = inspect_error
    return context


def _case_for_owner(request, case_id):
    """The case, if the user is one of its endpoint's accountable owners (or
    staff): the only people who see it, so anyone else gets 404."""
    case = selectors.get_case(case_id, user=request.user)
    if not is_owner(request.user, case.endpoint):  # defence in depth: visible means owner
        raise PermissionDenied("only the endpoint's owners may act on its recovery case")
    return case


def _casework(request, case, *, status: int = 200, **forms) -> HttpResponse:
    # Reread: the service has just changed the case (state, decided_at, ...).
    case = selectors.get_case(case.id, user=request.user)
    context = _case_context(request, case, **forms)
    return page(request, "console/case_detail.html", context, region="casework", status=status)


def _after_action(request, case) -> HttpResponse:
    if request.htmx:
        return _casework(request, case)
    return redirect("case_detail", case_id=case.id)  # post/redirect/get without htmx


@login_required
def case_detail(request, case_id):
    case = selectors.get_case(case_id, user=request.user)
    return page(
        request, "console/case_detail.html", _case_context(request, case), region="casework"
    )


@login_required
@require_POST
def case_inspect(request, case_id):
    case = _case_for_owner(request, case_id)
    try:
        inspection = recovery_services.inspect_case(case_id=case.id, user=request.user)
    except DomainError as exc:
        return _casework(request, case, status=REFUSED, inspect_error=exc.detail)
    messages.success(request, f"Inspection taken: sha256 {inspection.sha256[:16]}…")
    return _after_action(request, case)


def _rerun_changes(data: dict) -> dict:
    """The re-run's input and budget, for authorize_rerun only: the fields
    are prefilled for it and mean nothing to the other actions."""
    if data["action"] != "authorize_rerun":
        return {}
    return {"rerun_input": data["rerun_input"], "rerun_budget_s": data["rerun_budget_s"]}


@login_required
@require_POST
def case_decide(request, case_id):
    case = _case_for_owner(request, case_id)
    form = DecisionForm(
        request.POST,
        inspections=selectors.case_inspections(case.id),
        prefix="decision",
        budget_cap=case.endpoint.turn_budget_s,
    )
    if form.is_valid():
        try:
            decision = recovery_services.decide(
                case_id=case.id,
                user=request.user,
                action=form.cleaned_data["action"],
                inspection_id=form.cleaned_data["inspection"].id,
                rationale=form.cleaned_data["rationale"],
                evidence=form.cleaned_data["evidence"],
                **_rerun_changes(form.cleaned_data),
            )
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Decision recorded: {decision.action}.")
            return _after_action(request, case)
    return _casework(request, case, status=REFUSED, decision_form=form)


@login_required
@require_POST
def case_lesson(request, case_id):
    case = _case_for_owner(request, case_id)
    form = LessonWithProposalForm(request.POST, prefix="lesson")
    if form.is_valid():
        try:
            recovery_services.write_lesson(
                case_id=case.id,
                user=request.user,
                proposal=form.proposal(),
                **form.lesson_fields(),
            )
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, "Lesson written.")
            return _after_action(request, case)
    return _casework(request, case, status=REFUSED, lesson_form=form)


@login_required
def lesson_list(request):
    return page(
        request,
        "console/lesson_list.html",
        {
            "section": "lessons",
            "lessons": _with_proposals(
                recovery_selectors.list_lessons(user=request.user, limit=selectors.LIST_CAP),
                user=request.user,
            ),
            "cap": selectors.LIST_CAP,
        },
    )


def _with_proposals(lessons: list, *, user) -> list:
    """Each lesson with the changes it proposed (one query for the page)."""
    from endpoints.models import ChangeProposal

    by_lesson: dict[str, list] = {}
    rows = ChangeProposal.objects.filter(
        origin__lesson__in=[str(lesson.id) for lesson in lessons]
    ).select_related("endpoint", "proposer", "review__reviewer")
    for proposal in rows.order_by("created_at"):
        by_lesson.setdefault(proposal.origin["lesson"], []).append(
            generation_selectors.proposal_payload(proposal, user=user)
        )
    for lesson in lessons:
        lesson.proposals = by_lesson.get(str(lesson.id), [])
    return lessons


# --- Obligations -------------------------------------------------------------------------------


@login_required
def obligation_list(request):
    cursor = request.GET.get("cursor", "").strip() or None
    rows, next_cursor, error = [], None, None
    try:
        rows, next_cursor = selectors.open_obligations(user=request.user, cursor=cursor)
    except DomainError as exc:
        error = exc.detail
    return page(
        request,
        "console/obligation_list.html",
        {
            "section": "obligations",
            "obligations": rows,
            "cursor": cursor,
            "next_cursor": next_cursor,
            "error": error,
            "first_page": reverse("obligation_list"),
        },
        region="table",
        status=400 if error else 200,
    )


# --- Preferences -------------------------------------------------------------------------------


@require_POST
def theme(request):
    """The user's colour theme (light, dark or system), remembered for them
    and rendered in ``<html data-theme>`` on every page. console.js asks for
    JSON and switches the page in place; a plain form post (no script) goes
    back to the page it came from. Only the caller's own preference."""
    wants_json = "application/json" in request.headers.get("Accept", "")
    if not request.user.is_authenticated:
        if wants_json:
            return JsonResponse({"error": "unauthenticated", "detail": "Log in again."}, status=401)
        return redirect_to_login(reverse("dashboard"))
    try:
        chosen = preferences.set_theme(user=request.user, theme=request.POST.get("theme", ""))
    except Invalid as exc:
        if wants_json:
            return JsonResponse(exc.payload(), status=exc.status)
        messages.error(request, exc.detail)
        chosen = None
    if wants_json:
        return JsonResponse({"theme": chosen})
    back = request.POST.get("next", "")
    if not back.startswith("/") or not url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        back = reverse("dashboard")
    return redirect(back)
