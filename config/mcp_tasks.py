"""MCP Tasks at ``/mcp``: the ``io.modelcontextprotocol/tasks`` extension
(SEP-2663) served from the ledger (docs/reference/mcp.md, "Tasks").

A task *is* a ticket: its id is the ticket's id, its status is read from the
ticket's state, its result is what ``submit_ticket`` answers once the ticket
has finished, and cancelling it is the ticket's cancel. Nothing here keeps a
task of its own, so any web process answers for any task, a client's MCP
session can end and another one (or another process) carries on by the task
id, and the ledger stays the one record: every read goes through the
tickets' selectors with the caller's visibility, every change through the
runtime's cancel service.

The extension's methods, as SEP-2663 defines them:

- ``tools/call`` of ``submit_ticket`` answers with a task handle
  (``resultType: "task"``) when the request declares the extension in its
  capabilities and the ticket has not finished by the time the call would
  answer; otherwise the ordinary result (a server decides per request).
- ``tasks/get``: the task, with the final result (``completed``) or error
  (``failed``) inlined. A ticket the caller may not see is ``-32602`` "task
  not found", exactly as an id that does not exist.
- ``tasks/update``: acknowledged; the ledger never asks the requestor for
  input through a task (an owner's approval is decided on the approvals
  route), so there is never a request outstanding to answer.
- ``tasks/cancel``: acknowledged whatever the id (the extension's rule, which
  also keeps a stranger's id indistinguishable from an unknown one); a task
  the caller may see is cancelled by the ledger's cancel service.

``tasks/result`` and ``tasks/list`` (the 2025-11-25 experimental tasks) are
not served: SEP-2663 removes both and requires ``-32601`` for the first.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import Http404, HttpRequest

from core.errors import DomainError, NotFound

log = logging.getLogger(__name__)

EXTENSION = "io.modelcontextprotocol/tasks"
# Where a task carries the ledger's own words (its state, a recovery case):
# a ``_meta`` key under this server's prefix, as the protocol reserves
# ``_meta`` for such additions.
LEDGER_META = "io.claimcheck/ticket"

# JSON-RPC codes the extension names: a task that does not exist (or that the
# caller may not see) on tasks/get is invalid params; the ledger briefly
# unreachable is an internal error the client retries.
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
# A ticket that failed or was orphaned: an implementation-defined server
# error (JSON-RPC reserves -32000 to -32099 for them) carrying the ledger's
# error in ``data``.
TICKET_FAILED = -32000


# What tasks/get suggests between polls: a ticket's state changes at turn
# boundaries, seconds apart; the key's request limits bound a faster poller.
POLL_INTERVAL_MS = 2000


def requested(ctx) -> bool:
    """Whether this request declared the extension: a server MUST NOT answer
    with a task handle otherwise (per-request capabilities on the 2026
    wire; an older wire has no extensions, hence no tasks)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    extensions = getattr(caps, "extensions", None) if caps is not None else None
    return bool(extensions) and EXTENSION in extensions


def tool_result(payload: dict[str, Any], *, is_error: bool = False) -> dict[str, Any]:
    """A ``CallToolResult`` as ``tools/call`` answers it (config/mcp.py):
    the structured ticket, and the same JSON as text."""
    return {
        "content": [{"type": "text", "text": json.dumps(payload, ensure_ascii=False)}],
        "structuredContent": payload,
        "isError": is_error,
    }


def _case_of(ticket) -> str | None:
    from recovery.models import RecoveryCase

    case_id = (
        RecoveryCase.objects.filter(ticket_id=ticket.id)
        .order_by("-opened_at")
        .values_list("id", flat=True)
        .first()
    )
    return str(case_id) if case_id else None


def _waits_for_an_owner(ticket) -> bool:
    from runtime.agents.selectors import pending_approvals

    return any(
        call["decision"] is None for call in pending_approvals(ticket.endpoint, ticket=ticket)
    )


def task(ticket, *, detailed: bool) -> dict[str, Any]:
    """The extension's ``Task`` for a ticket; ``detailed`` inlines what the
    status carries (``tasks/get``), a creation handle carries none.

    queued and running are ``working``; waiting is ``input_required`` while
    an owner's approval is outstanding (the decision is the owners', on the
    approvals route: no input request is the requestor's to answer), else
    ``working`` (its delegated work runs); succeeded is ``completed``;
    failed is ``failed``; cancelled ``cancelled``. recovering is
    ``working`` (the ledger has not decided, and may yet finish the ticket)
    and orphaned is ``failed``, both naming their recovery case under
    ``_meta["io.claimcheck/ticket"]``.
    """
    from tickets.models import TicketState
    from tickets.selectors import ticket_payload

    state = ticket.state
    ledger: dict[str, Any] = {"state": state}
    message = None
    extra: dict[str, Any] = {}
    if state in (TicketState.QUEUED, TicketState.RUNNING):
        status = "working"
        message = f"the ticket is {state}"
    elif state == TicketState.WAITING:
        if _waits_for_an_owner(ticket):
            status = "input_required"
            message = "the ticket waits for an owner's approval of a tool call"
            extra = {"inputRequests": {}} if detailed else {}
        else:
            status = "working"
            message = "the ticket waits for the work it delegated"
    elif state == TicketState.RECOVERING:
        status = "working"
        ledger["case"] = _case_of(ticket)
        message = f"the ticket's turn is uncertain: recovery case {ledger['case']}"
    elif state == TicketState.SUCCEEDED:
        status = "completed"
        message = "the ticket succeeded"
        if detailed:
            extra = {"result": tool_result(ticket_payload(ticket))}
    elif state == TicketState.CANCELLED:
        status = "cancelled"
        message = "the ticket was cancelled"
    else:  # failed, orphaned
        status = "failed"
        if state == TicketState.ORPHANED:
            ledger["case"] = _case_of(ticket)
            message = f"the ticket was orphaned: recovery case {ledger['case']}"
        else:
            code = (ticket.error or {}).get("code") if isinstance(ticket.error, dict) else None
            message = f"the ticket failed: {code}" if code else "the ticket failed"
        if detailed:
            extra = {
                "error": {
                    "code": TICKET_FAILED,
                    "message": message,
                    "data": {"ticket": ticket_payload(ticket), **ledger},
                }
            }
    return {
        "taskId": str(ticket.id),
        "status": status,
        "statusMessage": message,
        "createdAt": ticket.created_at.isoformat(),
        "lastUpdatedAt": ticket.updated_at.isoformat(),
        # The ledger keeps a ticket for as long as it keeps its records; no
        # task expires on its own.
        "ttlSeconds": None,
        "pollIntervalMilliseconds": POLL_INTERVAL_MS,
        **extra,
        "_meta": {LEDGER_META: ledger},
    }


# --- The methods, run on the request's thread (config/mcp.py, step 4) -----------------------


class TaskNotFound(Exception):
    """The id names no task the caller may see."""


def get(request: HttpRequest, task_id: str) -> dict[str, Any]:
    from tickets.api import visible

    try:
        return task(visible(request, task_id), detailed=True)
    except (NotFound, Http404) as exc:
        raise TaskNotFound(task_id) from exc


def cancel(request: HttpRequest, task_id: str) -> None:
    """Ask the ledger to cancel; what it refuses (a finished ticket, a task
    the caller may not see) is acknowledged all the same: the client reads
    the outcome from tasks/get."""
    from tickets.api import cancel as cancel_ticket

    try:
        cancel_ticket(request, task_id)
    except (DomainError, Http404) as exc:
        log.info("mcp tasks/cancel %s: not cancelled (%s)", task_id, exc)


def created(request: HttpRequest, ticket_id: str) -> dict[str, Any] | None:
    """The handle for a ticket ``submit_ticket`` has just admitted (and
    committed: a tasks/get for it resolves), or None when it has finished
    and the ordinary result says all."""
    from tickets.models import TERMINAL_STATES
    from tickets.selectors import get_ticket

    ticket = get_ticket(ticket_id)
    if ticket.state in TERMINAL_STATES:
        return None
    return {"resultType": "task", **task(ticket, detailed=False)}


# --- The SDK's side ---------------------------------------------------------------------------

TOOL = "submit_ticket"


def submit(arguments: dict[str, Any]) -> dict[str, Any] | tuple[dict[str, Any], bool]:
    """``submit_ticket`` for a request that declared the extension: the task
    handle while the ticket has not finished, else the ordinary result
    (a failed call, or a ticket that finished within its ``wait_s``)."""
    from core.transient import drop_broken_connection, is_transient

    payload, error = _server_side["run_tool"](TOOL, arguments)
    if error:
        return payload, error
    try:
        handle = created(_server_side["current_request"](), payload["id"])
    except Exception as exc:
        if not is_transient(exc):
            raise
        # Admitted and committed: the ordinary answer names the ticket, which
        # the same dedupe key finds again.
        drop_broken_connection()
        return payload, error
    return handle if handle is not None else (payload, error)


def _on_request_thread(method: str, fn, task_id: str):
    """Run ``fn(request, task_id)`` for the request on this thread, its
    failures as the extension's JSON-RPC errors."""
    from mcp.shared.exceptions import MCPError

    from core.middleware import unavailable_body
    from core.transient import drop_broken_connection, is_transient

    request = _server_side["current_request"]()
    try:
        return fn(request, task_id)
    except TaskNotFound:
        raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found") from None
    except Exception as exc:
        if not is_transient(exc):
            log.exception("mcp %s failed", method)
            raise MCPError(INTERNAL_ERROR, "the server failed; the error is logged") from None
        drop_broken_connection()
        body = unavailable_body(request, exc, during=method)
        raise MCPError(INTERNAL_ERROR, body["detail"], data={**body, "status": 503}) from None


# What the server (config/mcp.py) lends the extension: the request being
# served on this thread and its tool runner, handed over at ``register``
# so that this module never imports the server back.
_server_side: dict[str, Any] = {}


def register(server, *, current_request, run_tool) -> None:
    """Serve the extension on the SDK's low-level ``server`` and advertise
    it; ``current_request()`` is the request on the calling thread,
    ``run_tool(name, arguments)`` the server's tool call."""
    _server_side.update(current_request=current_request, run_tool=run_tool)
    import mcp_types as types
    from asgiref.sync import sync_to_async
    from mcp.shared.exceptions import MCPError
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    class UpdateTaskParams(types.RequestParams):
        task_id: str
        input_responses: dict[str, Any] | None = None
        request_state: str | None = None

    run = sync_to_async(_on_request_thread, thread_sensitive=True)

    def extension_wire(ctx) -> None:
        # The extension is a 2026-07-28 one; the 2025-11-25 experimental
        # tasks, whose methods share these names, are not served.
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(METHOD_NOT_FOUND, "Method not found", data=ctx.method)

    async def get_task(ctx, params: types.GetTaskRequestParams) -> dict[str, Any]:
        extension_wire(ctx)
        return await run("tasks/get", get, params.task_id)

    async def update_task(ctx, params: UpdateTaskParams) -> dict[str, Any]:
        extension_wire(ctx)
        # No input request is ever outstanding (``task``): the extension
        # asks responses to unknown keys to be ignored, and the call acked.
        return {}

    async def cancel_task(ctx, params: types.CancelTaskRequestParams) -> dict[str, Any]:
        extension_wire(ctx)
        await run("tasks/cancel", cancel, params.task_id)
        return {}

    server.add_request_handler("tasks/get", types.GetTaskRequestParams, get_task)
    server.add_request_handler("tasks/update", UpdateTaskParams, update_task)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, cancel_task)
    server.extensions[EXTENSION] = {}
