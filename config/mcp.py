"""``/mcp``: a Model Context Protocol server (Streamable HTTP) inside the
WSGI app, authenticated and authorised exactly as the API (docs/reference/mcp.md).

The official ``mcp`` SDK speaks the protocol; this module carries an HTTP
request to it and back:

1. ``mcp_view`` is a plain Django view, so a request to ``/mcp`` passes
   through the same middleware stack as the API (request ids, the input
   guard, transient faults, limits). It answers ``POST`` only: the server
   is *stateless* (no ``Mcp-Session-Id``, nothing kept between requests, so
   any web process can answer any request) and answers each request with
   one JSON body (the SDK's ``json_response``), never a held-open event
   stream, which a gthread worker could not afford. ``GET`` (the optional
   server-to-client stream) and ``DELETE`` (ending a session) are 405, as
   the transport specification allows a server that offers neither.
2. The caller is decided first, by the API's own bearer authentication
   (``accounts.auth.ApiKeyAuth``): no key or a wrong one is 401 before the
   body is read.
3. The request goes to the SDK's ``StreamableHTTPSessionManager`` as one
   ASGI call, on an event loop that ``asgiref.async_to_sync`` runs in a
   helper thread for this request alone, while the request thread waits.
4. A tool call hops back onto the request thread
   (``sync_to_async(thread_sensitive=True)``) and runs there as ordinary
   synchronous Django code: the request's own database connection, no event
   loop in the thread (the ORM refuses to run beside one), and a wait holds
   this thread exactly as the API's ``wait_s`` does.

Tools are declared by their app (``tickets/mcp.py``, ``runtime/mcp.py``) and call the functions
the API's routes call. This module validates their arguments with pydantic
models (the API's own where a route has a body) and turns every error into
a tool error carrying the API's documented code and status.

The SDK is imported on the first ``/mcp`` request of a process, not at
start: its protocol types take seconds of CPU to build, which no other
request, worker or test process should pay.
"""

from __future__ import annotations

import contextvars
import json
import logging
from functools import cache
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from core.errors import DomainError, RateLimited, error_body, error_response
from core.inputs import check_fields
from core.tools import Tool

log = logging.getLogger(__name__)

# The request being served, for the tool that runs on its thread.
_request: contextvars.ContextVar[HttpRequest] = contextvars.ContextVar("mcp_request")

INSTRUCTIONS = (
    "Claimcheck keeps asynchronous agent work as tickets. Submit work to an endpoint "
    "(submit_ticket, with a dedupe key: a retry with the same key and input returns the "
    "same ticket), follow it (get_ticket, wait_for_ticket, get_ticket_events, "
    "get_lineage), find it (list_tickets, search_tickets) and cancel it (cancel_ticket). "
    "A failed call's result carries the HTTP API's error code (not_found, invalid, "
    "dedupe_conflict, endpoint_quarantined, circuit_open, rate_limited, unavailable, ...) "
    "and status."
)


@cache
def tools() -> dict[str, Tool]:
    """Every app's tools by name, collected on first use (the apps' tool
    modules import this one)."""
    from runtime.mcp import TOOLS as RUNTIME_TOOLS
    from tickets.mcp import TOOLS as TICKET_TOOLS

    found: dict[str, Tool] = {}
    for tool in [*TICKET_TOOLS, *RUNTIME_TOOLS]:
        if tool.name in found:
            raise ValueError(f"MCP tool {tool.name!r} is declared twice")
        found[tool.name] = tool
    return found


@cache
def input_schemas() -> dict[str, dict[str, Any]]:
    return {name: tool.params.model_json_schema() for name, tool in tools().items()}


@cache
def definitions() -> list:
    """``tools/list``: built once per process (the schemas do not change)."""
    import mcp_types as types

    return [
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            input_schema=input_schemas()[tool.name],
            output_schema=tool.output.model_json_schema() if tool.output else None,
            annotations=types.ToolAnnotations(
                title=tool.title,
                read_only_hint=tool.read_only,
                destructive_hint=tool.destructive,
                idempotent_hint=tool.idempotent,
                # The call touches the ledger only, no outside world.
                open_world_hint=False,
            ),
        )
        for tool in tools().values()
    ]


# --- Running a tool: validation, the call, errors -------------------------------------------


def error_payload(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The API's error body (API.md "Errors") and the HTTP status the API
    would have answered."""
    return {**error_body(code, detail, **extra), "status": status}


def invalid_arguments(exc: ValidationError) -> dict[str, Any]:
    """Arguments that fail the model: the API's 422 ``invalid``, the same
    ``errors: [{loc, msg}]`` (config/api.py)."""
    problems, errors = [], []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [str(p) for p in err.get("loc", ())]
        problems.append(f"{'.'.join(loc) or 'arguments'}: {err.get('msg', 'invalid')}")
        errors.append({"loc": loc, "msg": err.get("msg")})
    return error_payload(422, "invalid", "; ".join(problems), errors=errors)


def run_tool(name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Run tool ``name`` for the request on this thread (step 4 of the module
    docstring): ``(structured result, is_error)``.

    Every failure becomes an error result with the API's code, never an
    exception out of here: the SDK would turn one into a generic message.
    """
    from core.middleware import unavailable_body
    from core.transient import drop_broken_connection, is_transient

    tool = tools().get(name)
    if tool is None:
        return error_payload(404, "not_found", f"no tool {name!r}; tools/list names them"), True
    request = _request.get()
    try:
        # What the API's JSON parser refuses (NUL, a lone surrogate, NaN, an
        # argument nested past TICKET_MAX_JSON_DEPTH): 400 invalid naming it.
        check_fields(arguments, path="arguments")
        return tool.run(request, tool.params.model_validate(arguments)), False
    except ValidationError as exc:
        answer = invalid_arguments(exc)
    except DomainError as exc:
        answer = {**exc.payload(), "status": exc.status}
    except Http404 as exc:
        answer = error_payload(404, "not_found", str(exc) or "not found")
    except Exception as exc:
        if not is_transient(exc):
            log.exception("mcp tool %s failed", name)
            return error_payload(500, "internal", "the server failed; the error is logged"), True
        # The API's 503 (core/middleware.py): its body, and its log line,
        # at most one a second per process however many calls meet the
        # outage. Repeating the same call (the same dedupe key, for a
        # submission) is safe.
        drop_broken_connection()
        body = unavailable_body(request, exc, during=f"tool {name}")
        return {**body, "status": 503}, True
    # What Django's request log says of an API route's 4xx (the HTTP
    # status of /mcp is 200 whatever the tool answered).
    log.info("mcp tool %s: %s %s", name, answer["status"], answer["error"])
    return answer, True


# --- The SDK's side ---------------------------------------------------------------------------


@cache
def _server():
    """The SDK's low-level server: the tools above and the tasks extension
    (config/mcp_tasks.py), nothing else (no resources, prompts or sessions)."""
    import mcp_types as types
    from asgiref.sync import sync_to_async
    from mcp.server.lowlevel import Server

    from . import mcp_tasks

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions())

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult | dict:
        if params.name == mcp_tasks.TOOL and mcp_tasks.requested(ctx):
            answer = await sync_to_async(mcp_tasks.submit, thread_sensitive=True)(
                params.arguments or {}
            )
            if isinstance(answer, dict):  # a task handle (config/mcp_tasks.py)
                return answer
            payload, error = answer
        else:
            payload, error = await sync_to_async(run_tool, thread_sensitive=True)(
                params.name, params.arguments or {}
            )
        # The structured result, and the same JSON as text for clients
        # that read only text.
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
            structured_content=payload,
            is_error=error,
        )

    server = Server(
        "claimcheck",
        version="1",
        title="Claimcheck",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=lambda name: input_schemas().get(name),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    mcp_tasks.register(server, current_request=_request.get, run_tool=run_tool)
    return server


async def _exchange(scope: dict[str, Any], body: bytes) -> tuple[int, list, bytes]:
    """One HTTP exchange through the SDK: ``(status, headers, body)``.

    A session manager per request: stateless, it keeps nothing between
    requests, and its task group lives on this request's event loop."""
    import anyio
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    manager = StreamableHTTPSessionManager(
        app=_server(),
        json_response=True,
        stateless=True,
        # Django has checked Host (ALLOWED_HOSTS); a browser cannot send the
        # bearer key cross-origin without a preflight this server never grants.
        security_settings=None,
        max_request_body_size=settings.API_MAX_BODY_BYTES,
    )
    status, headers, chunks = 500, [], []
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The whole body has been read (WSGI): nothing more comes until the
        # exchange ends and cancels this wait.
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    async with manager.run():
        await manager.handle_request(scope, receive, send)
    return status, headers, b"".join(chunks)


def _scope(request: HttpRequest) -> dict[str, Any]:
    host, _, port = request.get_host().rpartition(":")
    if not host or not port.isdigit():
        host, port = request.get_host(), "443" if request.is_secure() else "80"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        # The key stays here: the SDK has no use for it.
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.items()
            if name.lower() != "authorization"
        ],
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (host, int(port)),
    }


# What of the SDK's answer reaches the client: the body's type and the
# protocol's own headers (Django's middleware adds the rest).
_PASSED_HEADERS = frozenset({"content-type", "mcp-protocol-version", "mcp-session-id"})


@csrf_exempt
def mcp_view(request: HttpRequest) -> HttpResponse:
    """``/mcp``: steps 1 to 3 of the module docstring."""
    from asgiref.sync import async_to_sync

    from accounts.auth import ApiKeyAuth
    from core.middleware import body_too_large

    if request.method != "POST":
        return error_response(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed on /mcp: the server is stateless and answers "
            "each POST with one JSON body (no event stream, no sessions)",
            headers={"Allow": "POST"},
        )
    try:
        caller = ApiKeyAuth()(request)
    except RateLimited as exc:  # the key's requests in flight, as on the API (fairshare.py)
        return exc.response()
    if caller is None:
        return error_response(
            401,
            "unauthenticated",
            "a valid 'Authorization: Bearer <key>' is required",
            headers={"WWW-Authenticate": 'Bearer realm="claimcheck"'},
        )
    too_large = body_too_large(request)
    if too_large is not None:
        return too_large
    token = _request.set(request)
    try:
        status, headers, body = async_to_sync(_exchange)(_scope(request), request.body)
    finally:
        _request.reset(token)
    response = HttpResponse(body, status=status)
    del response["Content-Type"]  # the SDK's, if it sent one (a 202 has no body)
    for name, value in headers:
        name = name.decode("latin-1").lower()
        if name in _PASSED_HEADERS:
            response[name] = value.decode("latin-1")
    response["Cache-Control"] = "no-store"
    return response
