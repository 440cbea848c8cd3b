"""The user's own console preferences (today: the colour theme)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core.errors import Invalid

from .. import preferences


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
