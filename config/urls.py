from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path

from config.a2a import a2a_view, agent_card_view
from config.api import api
from config.mcp import mcp_view
from config.metrics import metrics_view
from health import views as health_views


def api_not_found(request, rest=""):
    return JsonResponse(
        {"error": "not_found", "detail": f"no route {request.method} {request.path}"}, status=404
    )


urlpatterns = [
    path("admin/", admin.site.urls),
    # Probes: no login (nothing sensitive in them).
    path("healthz", health_views.healthz, name="healthz"),
    path("readyz", health_views.readyz, name="readyz"),
    # Prometheus: METRICS_ALLOWED_IPS / METRICS_BEARER_TOKEN, else 404.
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", api.urls),
    # The MCP server (Streamable HTTP, stateless, JSON answers): docs/reference/mcp.md.
    path("mcp", mcp_view, name="mcp"),
    # Each endpoint as an A2A agent (JSON-RPC) and its card: docs/howto/a2a.md.
    path("a2a/<str:address>", a2a_view, name="a2a"),
    path("a2a/<str:address>/.well-known/agent-card.json", agent_card_view, name="a2a-agent-card"),
    re_path(r"^api/(?P<rest>.*)$", api_not_found),
    path("", include("console.urls")),
]

# A transient fault raised outside a view (a middleware saving the session)
# is a 503, not Django's 500 page (core/middleware.py).
handler500 = "core.middleware.server_error"
handler400 = "core.middleware.bad_request"
