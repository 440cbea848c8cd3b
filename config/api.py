"""The one NinjaAPI: bearer-key auth and every error in the documented shape."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts.auth import ApiKeyAuth
from config.openapi import DocumentedErrorsAPI
from core.errors import DomainError, error_response
from core.inputs import JsonParser

log = logging.getLogger(__name__)


# JsonParser: JSON bodies only, refusing what PostgreSQL cannot store (400
# naming the field); DocumentedErrorsAPI: every route's error statuses in the
# OpenAPI document (core/inputs.py, config/openapi.py).
api = DocumentedErrorsAPI(
    title="Claimcheck",
    version="1",
    description="A ledger and runtime for reliable asynchronous agent work.",
    auth=ApiKeyAuth(),
    urls_namespace="api",
    parser=JsonParser(),
)


@api.exception_handler(DomainError)
def _domain_error(request, exc: DomainError):
    return exc.response()


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
    if isinstance(exc.__cause__, DomainError):
        # ninja wraps whatever the body parser raises in a generic 400
        # ("Cannot parse request body"); JsonParser's Invalid says what and where.
        return _domain_error(request, exc.__cause__)
    # One table of status -> code for the API and the error middleware.
    from core.middleware import CODES

    return error_response(exc.status_code, CODES.get(exc.status_code, "invalid"), str(exc))


@api.exception_handler(Http404)
def _not_found(request, exc):
    return error_response(404, "not_found", str(exc) or "not found")


@api.exception_handler(RequestDataTooBig)
def _body_too_big(request, exc):
    # Django's own cap (DATA_UPLOAD_MAX_MEMORY_SIZE, kept >= API_MAX_BODY_BYTES
    # in settings): InputGuardMiddleware normally answers first.
    return error_response(413, "too_large", "the request body is over the size Django reads")


# --- Transient faults: 503 `unavailable` with Retry-After, never a 500 ----------------------
# Registered per class: ninja looks a handler up by the exception's MRO.
def _unavailable(request, exc):
    from core.middleware import unavailable_response
    from core.transient import drop_broken_connection

    drop_broken_connection()
    return unavailable_response(request, exc)


def _register_transient_handlers() -> None:
    from core.transient import TRANSIENT_ERRORS

    for exc_class in TRANSIENT_ERRORS:
        api.add_exception_handler(exc_class, _unavailable)


_register_transient_handlers()


def register_routers() -> None:
    from endpoints.api import proposals_router
    from recovery.api import router as recovery_router
    from runtime.api import endpoints_router, turns_router, workers_router
    from tickets.api import router as tickets_router
    from tickets.schedules_api import router as schedules_router

    # One router per prefix, composed by the app that owns it: /tickets is
    # the ledger's (tickets/api.py), /endpoints the runtime's, which mounts
    # the directory's routes of an endpoint (runtime/api.py). Django tries
    # the patterns in this order: the tickets' first, as POST /tickets is the
    # hottest route.
    api.add_router("/tickets", tickets_router)
    api.add_router("/endpoints", endpoints_router)
    api.add_router("/turns", turns_router)
    api.add_router("/recovery", recovery_router)
    api.add_router("/workers", workers_router)
    api.add_router("/proposals", proposals_router)
    api.add_router("/schedules", schedules_router)


register_routers()
