"""The one NinjaAPI: bearer-key auth and every error in the documented shape."""

from __future__ import annotations

import logging

from django.http import Http404, HttpRequest, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from config.errors import DomainError

log = logging.getLogger(__name__)


class ApiKeyAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        from console.keys import user_for_key

        user = user_for_key(token)
        if user is not None:
            request.user = user
        return user


api = NinjaAPI(
    title="Claimcheck",
    version="1",
    description="A ledger and runtime for reliable asynchronous agent work.",
    auth=ApiKeyAuth(),
    urls_namespace="api",
)


def error_response(status: int, code: str, detail: str, **extra) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail, **extra}, status=status)


@api.exception_handler(DomainError)
def _domain_error(request, exc: DomainError):
    return JsonResponse(exc.payload(), status=exc.status)


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    problems = []
    for err in exc.errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "payload"))
        problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return error_response(
        422,
        "invalid",
        "; ".join(problems) or "the request is not valid",
        errors=[{"loc": list(map(str, e.get("loc", ()))), "msg": e.get("msg")} for e in exc.errors],
    )


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return error_response(
        401, "unauthenticated", "a valid 'Authorization: Bearer <key>' is required"
    )


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    codes = {
        400: "invalid",
        401: "unauthenticated",
        403: "forbidden",
        404: "not_found",
        405: "invalid",
        413: "too_large",
    }
    return error_response(exc.status_code, codes.get(exc.status_code, "invalid"), str(exc))


@api.exception_handler(Http404)
def _not_found(request, exc):
    return error_response(404, "not_found", str(exc) or "not found")


def register_routers() -> None:
    from endpoints.api import router as endpoints_router
    from endpoints.api import turns_router
    from recovery.api import router as recovery_router
    from tickets.api import router as tickets_router

    api.add_router("/endpoints", endpoints_router)
    api.add_router("/tickets", tickets_router)
    api.add_router("/turns", turns_router)
    api.add_router("/recovery", recovery_router)


register_routers()
