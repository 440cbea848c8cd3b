from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path

from config.api import api


def api_not_found(request, rest=""):
    return JsonResponse(
        {"error": "not_found", "detail": f"no route {request.method} {request.path}"}, status=404
    )


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    re_path(r"^api/(?P<rest>.*)$", api_not_found),
    path("", include("console.urls")),
]
