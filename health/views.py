"""Probes for load balancers and orchestrators: no login, nothing sensitive."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from .checks import readiness


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Touches neither database nor broker, so
    an outage of either never gets a healthy web process restarted."""
    return JsonResponse({"ok": True})


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: database, broker and sweepers. 200 when every check passes,
    503 naming the ones that failed."""
    ready = readiness()
    return JsonResponse(ready.as_dict(), status=200 if ready.ok else 503)
