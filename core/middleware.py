"""Every answer under /api/ is JSON in the documented error shape, including
the ones Django or ninja would write their own way (405, a 500 page)."""

from __future__ import annotations

import logging
import sys
import threading
import time

from django.conf import settings
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults

from core.errors import error_body
from core.inputs import Unstorable, is_json, join, text_problem

log = logging.getLogger(__name__)

CODES = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    429: "rate_limited",
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


# --- Input the ledger cannot store; bodies over the limit ---------------------------------------


class InputGuardMiddleware:
    """Before anything is routed or read from the database (sessions, API
    keys): a NUL or lone surrogate in the path, the query string, a header or
    a console form field is 400 naming where it was (PostgreSQL cannot store
    it, and a query carrying it would fail as a 500); an API request whose
    body is over ``API_MAX_BODY_BYTES`` is 413 ``too_large`` before the body
    is read. JSON bodies are checked as they are parsed (core/inputs.py)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        is_api = request.path.startswith("/api/")
        try:
            check_request(request, forms=not is_api)
        except Unstorable as exc:
            if is_api:
                return JsonResponse(exc.payload(), status=400)
            return HttpResponseBadRequest(
                f"Bad request: {exc.detail}.\n", content_type="text/plain; charset=utf-8"
            )
        if is_api:
            too_large = body_too_large(request)
            if too_large is not None:
                return too_large
        return self.get_response(request)


def check_request(request, *, forms: bool) -> None:
    """Raise ``Unstorable`` for the first unstorable text outside a JSON body."""
    problem = text_problem(request.path)
    if problem:
        raise Unstorable("path", problem)
    sources = [("query", request.GET)]
    if forms and request.method == "POST" and not is_json(request.content_type or ""):
        sources.append(("form", request.POST))
    for prefix, data in sources:
        for key, values in data.lists():
            field = join(prefix, key)
            problem = text_problem(key)
            if problem:
                raise Unstorable(field, f"is a name that {problem}")
            for value in values:
                problem = text_problem(value)
                if problem:
                    raise Unstorable(field, problem)
    for name, value in request.headers.items():
        problem = text_problem(value)
        if problem:
            raise Unstorable(f"headers.{name}", problem)


def body_too_large(request) -> JsonResponse | None:
    """413 when the declared length is over the limit. WSGI reads no more
    than CONTENT_LENGTH bytes of a body (Django's LimitedStream), so the
    declared length bounds what the API parses."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None  # Django reads such a body as empty
    limit = settings.API_MAX_BODY_BYTES
    if length <= limit:
        return None
    return JsonResponse(
        {
            "error": "too_large",
            "detail": f"the request body is {length} bytes, over the API's limit of {limit} "
            "(API_MAX_BODY_BYTES); large content belongs in artifacts",
            "limit": limit,
        },
        status=413,
    )


# --- Transient faults: 503 with Retry-After, never a 500 ------------------------------------
# A database restart or a broker blip is the client's cue to retry, not a
# server bug: JSON `unavailable` under /api/ (and for the probes), a small
# HTML page for the console, both with Retry-After. ninja's own handler
# (config/api.py) catches what a route raises; this middleware catches what a
# console view raises (process_exception), and ``server_error`` (handler500)
# and ``bad_request`` (handler400) what a middleware raises around the view
# (the session's save, say).


def _wants_json(request) -> bool:
    return request.path.startswith(("/api/", "/healthz", "/readyz", "/mcp", "/a2a/"))


def _outage(exc: BaseException) -> tuple[str, int]:
    """(what is unreachable, the Retry-After in seconds) for a transient fault."""
    from core.transient import TRANSIENT_BROKER_ERRORS

    what = "message broker" if isinstance(exc, TRANSIENT_BROKER_ERRORS) else "database"
    return what, max(1, int(settings.UNAVAILABLE_RETRY_AFTER_S))


def unavailable_body(request, exc: BaseException, *, during: str = "") -> dict:
    """The documented 503 ``unavailable`` body for a transient fault,
    logged as every 503 is (at most one WARNING a second per process:
    ``_log_unavailable``); ``during`` names what met it, for the log line.
    The answer's own form is the caller's: a response
    (``unavailable_response``), or an MCP tool error (config/mcp.py)."""
    from core.transient import describe

    what, retry_after = _outage(exc)
    _log_unavailable(request, f"{during}: {describe(exc)}" if during else describe(exc))
    return error_body(
        "unavailable",
        f"the {what} is briefly unreachable; retry in {retry_after} s",
        retry_after=retry_after,
    )


def unavailable_response(request, exc: BaseException) -> HttpResponse:
    body = unavailable_body(request, exc)
    what, retry_after = _outage(exc)
    if _wants_json(request):
        response: HttpResponse = JsonResponse(body, status=503)
    else:
        response = HttpResponse(
            render_to_string("503.html", {"what": what, "retry_after": retry_after}),
            status=503,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = str(retry_after)
    response["Cache-Control"] = "no-store"
    # Logged above, at WARNING: Django's own line for a 5xx ("Service
    # Unavailable: ...", ERROR in django.request) would repeat it per request.
    response._has_been_logged = True
    return response


UNAVAILABLE_LOG_EVERY_S = 1.0
_unavailable_log = {"at": -1e9, "suppressed": 0}
_unavailable_log_lock = threading.Lock()


def _log_unavailable(request, cause: str) -> None:
    """One WARNING per second per process at most, naming the cause and how
    many 503s were answered since the last line: an outage is one event, not
    a line per request (and an error-level line would page someone for what
    the service rides out by itself)."""
    now = time.monotonic()
    with _unavailable_log_lock:
        if now - _unavailable_log["at"] < UNAVAILABLE_LOG_EVERY_S:
            _unavailable_log["suppressed"] += 1
            return
        suppressed, _unavailable_log["suppressed"] = _unavailable_log["suppressed"], 0
        _unavailable_log["at"] = now
    log.warning(
        "503 unavailable for %s %s: %s%s",
        request.method,
        request.path,
        cause,
        f" ({suppressed} more 503s since the last line)" if suppressed else "",
    )


class TransientFaultMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        from core.transient import drop_broken_connection, is_transient

        if not is_transient(exception):
            return None
        drop_broken_connection()
        return unavailable_response(request, exception)


def bad_request(request, exception=None) -> HttpResponse:
    """handler400: Django's session middleware turns a failed session save
    into ``SessionInterrupted`` (a 400); when the save failed because the
    database was unreachable, that is a 503 like any other outage."""
    from core.transient import drop_broken_connection, is_transient

    if exception is not None and is_transient(exception):
        drop_broken_connection()
        return unavailable_response(request, exception)
    return defaults.bad_request(request, exception)


def server_error(request) -> HttpResponse:
    """handler500: Django calls it inside its ``except`` block, so the error
    is still at hand. A transient one answers 503; anything else gets
    Django's own 500 (reshaped to JSON under /api/ by ApiErrorShapeMiddleware)."""
    from core.transient import drop_broken_connection, is_transient

    exc = sys.exc_info()[1]
    if exc is not None and is_transient(exc):
        drop_broken_connection()
        return unavailable_response(request, exc)
    return defaults.server_error(request)
