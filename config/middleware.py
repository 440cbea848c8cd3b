"""Every answer under /api/ is JSON in the documented error shape, including
the ones Django or ninja would write their own way (405, a 500 page)."""

from __future__ import annotations

import logging

from django.http import JsonResponse

log = logging.getLogger(__name__)

CODES = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    500: "internal",
}


class ApiErrorShapeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            request.path.startswith("/api/")
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            status = response.status_code
            detail = {
                405: f"{request.method} is not allowed on {request.path}"
                + (f"; allowed: {response['Allow']}" if response.has_header("Allow") else ""),
                500: "the server failed; the error is logged",
            }.get(status, f"{request.method} {request.path} failed with status {status}")
            shaped = JsonResponse(
                {"error": CODES.get(status, "invalid"), "detail": detail}, status=status
            )
            if response.has_header("Allow"):
                shaped["Allow"] = response["Allow"]
            return shaped
        return response
