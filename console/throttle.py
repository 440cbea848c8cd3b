"""The client address that login throttling counts (django-axes calls it).

``REMOTE_ADDR`` unless the operator says how many proxies stand in front of
the app (``LOGIN_PROXY_COUNT``): then the address the outermost of them saw,
counted from the right of ``X-Forwarded-For``, because everything to its left
is whatever the client chose to send. The API's count of failed
authentications per address uses the same (``core.fairshare``).
"""

from __future__ import annotations

from core.fairshare import client_address as client_ip

__all__ = ["client_ip"]
