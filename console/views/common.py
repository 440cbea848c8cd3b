"""What every console view uses: the login guard, the page-or-region
renderer, and ``act``, the one way a view calls a service for a POST."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required as django_login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect

from core.errors import DomainError, NotFound

# A submission the service refused (or the form rejected) is answered 422 with
# the reason in the form's region; htmx is configured in base.html to swap 422.
REFUSED = 422

T = TypeVar("T")


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


def act(
    request: HttpRequest,
    service: Callable[[], T],
    *,
    done: str | Callable[[T], str | tuple[int, str]],
    refused: Callable[[str | None], HttpResponse],
    then: str | Callable[[T], str],
    region: Callable[[T], HttpResponse] | None = None,
    form: forms.Form | None = None,
    unknown_is_404: bool = False,
) -> HttpResponse:
    """Call a service for a POST and answer it, the same way everywhere:

    1. ``form``, when given, must be valid, else ``refused(None)`` (the form
       shows its own errors), answered 422.
    2. ``service()`` runs; a domain error (core/errors.py) is ``refused``
       with its message (also added to ``form`` as a non-field error),
       answered 422; with ``unknown_is_404`` a ``NotFound`` is 404 instead.
    3. Done: ``done`` (or ``done(result)``; a ``(level, text)`` pair for a
       level other than success) becomes a flash message, and the answer is
       ``region(result)`` when htmx asks and there is a region; else a
       redirect to ``then`` (a URL, or ``then(result)``): client-side for
       htmx, post/redirect/get otherwise.
    """
    if form is not None and not form.is_valid():
        return _refused(refused(None))
    try:
        result = service()
    except NotFound as exc:
        if unknown_is_404:
            raise Http404(exc.detail) from None
        return _refuse(refused, form, exc)
    except DomainError as exc:
        return _refuse(refused, form, exc)
    said = done(result) if callable(done) else done
    level, text = said if isinstance(said, tuple) else (messages.SUCCESS, said)
    messages.add_message(request, level, text)
    if request.htmx and region is not None:
        return region(result)
    url = then(result) if callable(then) else then
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


def _refuse(refused, form, exc: DomainError) -> HttpResponse:
    if form is not None:
        form.add_error(None, exc.detail)
    return _refused(refused(exc.detail))


def _refused(response: HttpResponse) -> HttpResponse:
    response.status_code = REFUSED
    return response
