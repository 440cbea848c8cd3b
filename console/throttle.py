"""The client address that login throttling counts (django-axes calls it).

``REMOTE_ADDR`` unless the operator says how many proxies stand in front of
the app (``LOGIN_PROXY_COUNT``): then the address the outermost of them saw,
counted from the right of ``X-Forwarded-For``, because everything to its left
is whatever the client chose to send.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    proxies = settings.LOGIN_PROXY_COUNT
    if proxies > 0:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [h for h in hops if h]
        if len(hops) >= proxies:
            return hops[-proxies]
    return request.META.get("REMOTE_ADDR")
