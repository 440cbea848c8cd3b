"""``/a2a/<address>``: every endpoint a caller may submit to, served as an
Agent2Agent (A2A 1.0) agent over JSON-RPC (docs/howto/a2a.md).

An A2A task *is* the ticket: its id is the ticket's id, the message id is the
ticket's dedupe key, and every call goes through the functions the API's
routes call (``tickets.api.create_ticket``, ``visible``, the runtime's
cancel), so keys, limits, visibility and errors are the API's own.

1. The caller is decided first, by the API's bearer authentication
   (``accounts.auth.ApiKeyAuth``): no key or a wrong one is 401 before the
   body is read. An endpoint the caller may not submit to does not exist
   (404), exactly like an unknown address.
2. The body is parsed with the ``a2a-sdk``'s protocol types (protobuf
   messages: ``ParseDict`` in, ``MessageToDict`` out), so the wire format is
   the SDK's; the methods are served here rather than by the SDK's
   Starlette dispatcher, which would need an event loop in the request
   thread, where Django's ORM refuses to run.
3. ``SendStreamingMessage`` and ``SubscribeToTask`` answer Server-Sent
   Events: the task, then a status update for each change the ledger
   witnesses (woken by the ticket's NOTIFY through ``tickets.waits``, no
   polling), until a terminal state. A stream holds one of the key's wait
   slots (core/fairshare.py); with none free it sends the task as it stands
   and ends, and the client subscribes again later.

The SDK is imported on the first ``/a2a`` request of a process, not at
start (its protobuf descriptors cost every other process nothing then).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from core.errors import DomainError, RateLimited, error_response

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "1.0"
# How long one stream may stay open; a client subscribes again past it.
STREAM_MAX_S = 600.0
# A comment line this often while nothing changes: a reader that has gone
# away is noticed (the write fails) and its thread and wait slot freed.
KEEPALIVE_S = 15.0
# How long a blocking SendMessage waits for a terminal state at most (never
# more than the API's ADMISSION_MAX_WAIT_S).
SEND_WAIT_S = 60.0

# JSON-RPC error codes (the A2A specification's, as the SDK maps them).
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED = -32004
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
PARSE_ERROR = -32700
# Any other refusal of the API (dedupe_conflict, endpoint_quarantined,
# rate_limited, ...): a server error whose data is the API's error body.
SERVER_ERROR = -32000

# The ticket's state -> the A2A task state's name (TaskState). ``recovering``
# ends ``orphaned`` or ``failed``, both failed here: the task says failed at
# once, its metadata names the recovery (docs/howto/a2a.md, "States").
STATES = {
    "queued": "TASK_STATE_SUBMITTED",
    "running": "TASK_STATE_WORKING",
    "waiting": "TASK_STATE_WORKING",
    "succeeded": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "cancelled": "TASK_STATE_CANCELED",
    "recovering": "TASK_STATE_FAILED",
    "orphaned": "TASK_STATE_FAILED",
}
TERMINAL_TASK_STATES = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}
)


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def body(self, request_id: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": request_id, "error": error}


def rpc_error(exc: DomainError | Http404, *, task: bool = False) -> RpcError:
    """The API's refusal as a JSON-RPC error; its data is the API's body
    with the HTTP status the API would have answered."""
    if isinstance(exc, Http404):
        payload, status = {"error": "not_found", "detail": str(exc) or "not found"}, 404
    else:
        payload, status = exc.payload(), exc.status
    data = {**payload, "status": status}
    code = payload["error"]
    if code == "not_found" and task:
        return RpcError(TASK_NOT_FOUND, "task not found", data)
    if code == "invalid":
        return RpcError(INVALID_PARAMS, payload["detail"], data)
    if code == "invalid_transition":
        return RpcError(TASK_NOT_CANCELABLE, payload["detail"], data)
    return RpcError(SERVER_ERROR, f"{code}: {payload['detail']}", data)


# --- The caller and the agent ------------------------------------------------------------------


@functools.cache
def _sdk_installed() -> bool:
    try:
        import a2a.types  # noqa: F401
    except ImportError:
        return False
    return True


def _caller(request: HttpRequest) -> HttpResponse | None:
    """Step 1: the API's authentication; an answer when refused. Without
    the SDK (the optional extra ``a2a``) there are no agents at all."""
    from accounts.auth import ApiKeyAuth

    if not _sdk_installed():
        return error_response(
            404, "not_found", "A2A is not installed on this server (the optional extra 'a2a')"
        )
    try:
        caller = ApiKeyAuth()(request)
    except RateLimited as exc:  # the key's requests in flight, as on the API
        return exc.response()
    if caller is None:
        return error_response(
            401,
            "unauthenticated",
            "a valid 'Authorization: Bearer <key>' is required",
            headers={"WWW-Authenticate": 'Bearer realm="claimcheck"'},
        )
    return None


def _agent(request: HttpRequest, address: str):
    """The endpoint behind ``/a2a/<address>``, or None when the caller may
    not submit to it: then it does not exist for them, as an unknown one."""
    from core.errors import NotFound
    from endpoints.selectors import may_submit, resolve_endpoint

    try:
        endpoint = resolve_endpoint(address)
    except NotFound:
        return None
    return endpoint if may_submit(request.user, endpoint) else None


def _no_agent(address: str) -> JsonResponse:
    return error_response(404, "not_found", f"no A2A agent {address!r}")


def agent_card(request: HttpRequest, endpoint) -> dict[str, Any]:
    """The endpoint's agent card: its address as the name, its notes as the
    description, one skill naming its runner's kind (and an agent's
    framework; no other runner setting, which are the owners')."""
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    from a2a.types import a2a_pb2 as pb

    runner = endpoint.runner if isinstance(endpoint.runner, dict) else {}
    kind = str(runner.get("kind") or "python")
    tags = [kind]
    if kind == "agent" and runner.get("framework"):
        tags.append(str(runner["framework"]))
    description = endpoint.notes.strip() or f"The Claimcheck endpoint {endpoint.address}."
    card = pb.AgentCard(
        name=endpoint.address,
        description=description,
        version=str(endpoint.generation),
        # One URL answers both: 1.0 first, which 1.x clients take; the 0.3
        # names are served too (the card then carries 0.3's own fields).
        supported_interfaces=[
            pb.AgentInterface(
                url=request.build_absolute_uri(f"/a2a/{endpoint.address}"),
                protocol_binding="JSONRPC",
                protocol_version=version,
            )
            for version in (PROTOCOL_VERSION, "0.3")
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        skills=[
            pb.AgentSkill(
                id=endpoint.address,
                name=endpoint.address,
                description=description,
                tags=tags,
                input_modes=["application/json", "text/plain"],
                output_modes=["application/json"],
            )
        ],
        security_schemes={
            "bearer": pb.SecurityScheme(
                http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                    scheme="bearer", description="A Claimcheck API key"
                )
            )
        },
        security_requirements=[pb.SecurityRequirement(schemes={"bearer": pb.StringList()})],
    )
    # The SDK's own serialisation: the 1.0 card with 0.3's fields merged in.
    return agent_card_to_dict(card)


@csrf_exempt
def agent_card_view(request: HttpRequest, address: str) -> HttpResponse:
    """``GET /a2a/<address>/.well-known/agent-card.json``."""
    if request.method != "GET":
        return error_response(
            405, "method_not_allowed", "the agent card is read with GET", headers={"Allow": "GET"}
        )
    refused = _caller(request)
    if refused is not None:
        return refused
    endpoint = _agent(request, address)
    if endpoint is None:
        return _no_agent(address)
    response = JsonResponse(agent_card(request, endpoint))
    response["Cache-Control"] = "no-store"
    return response


# --- Tickets as tasks ---------------------------------------------------------------------------


def message_input(message) -> dict[str, Any]:
    """A message's parts as the ticket's input: one data part holding a JSON
    object is the input itself; text parts are ``{"text": <the texts, one a
    line>}``. Anything else is refused: the ticket's input is a JSON object."""
    from google.protobuf.json_format import MessageToDict

    parts = list(message.parts)
    if len(parts) == 1 and parts[0].WhichOneof("content") == "data":
        value = MessageToDict(parts[0])["data"]
        if isinstance(value, dict):
            return value
    if parts and all(p.WhichOneof("content") == "text" for p in parts):
        return {"text": "\n".join(p.text for p in parts)}
    raise RpcError(
        INVALID_PARAMS,
        "message.parts must be one data part holding a JSON object, or text parts",
    )


def _context_id(ticket) -> str:
    """The contextId a task answers with: the one its message named, else
    the endpoint's address (an endpoint's agent has one conversation)."""
    a2a = ((ticket.requester or {}).get("metadata") or {}).get("a2a") or {}
    return str(a2a.get("context_id") or ticket.endpoint.address)


def _awaiting_owner(ticket) -> bool:
    """Waiting for an owner's approval: a result the endpoint holds until an
    owner approves it, or an agent's tool call an owner must decide."""
    if ticket.delivery_state == "awaiting_approval":
        return True
    if ticket.state != "waiting":
        return False
    from runtime.agents.selectors import pending_approvals

    return bool(pending_approvals(ticket.endpoint, ticket=ticket))


def task_dict(ticket) -> dict[str, Any]:
    """The ticket as an A2A Task (JSON, as ``MessageToDict`` writes it)."""
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import MessageToDict, ParseDict

    state = STATES[ticket.state]
    claimcheck: dict[str, Any] = {
        "ticket": str(ticket.id),
        "endpoint": ticket.endpoint.address,
        "state": ticket.state,
        "dedupe_key": ticket.dedupe_key,
    }
    if _awaiting_owner(ticket):
        state = "TASK_STATE_INPUT_REQUIRED"
        claimcheck["waiting_for"] = "owner_approval"
    if ticket.state in ("recovering", "orphaned"):
        from recovery.models import RecoveryCase

        # The newest case of this ticket (a re-run's case names the re-run).
        case = (
            RecoveryCase.objects.filter(ticket_id=ticket.id)
            .order_by("-opened_at")
            .values_list("id", flat=True)
            .first()
        )
        claimcheck["recovery"] = {"state": ticket.state, "case": str(case) if case else None}
    status: dict[str, Any] = {"state": state, "timestamp": ticket.updated_at.isoformat()}
    if ticket.error is not None and state == "TASK_STATE_FAILED":
        status["message"] = {
            "messageId": f"{ticket.id}:error",
            "role": "ROLE_AGENT",
            "taskId": str(ticket.id),
            "contextId": _context_id(ticket),
            "parts": [{"data": ticket.error, "mediaType": "application/json"}],
        }
    task = {
        "id": str(ticket.id),
        "contextId": _context_id(ticket),
        "status": status,
        "metadata": {"claimcheck": claimcheck},
    }
    artifacts = []
    if ticket.state == "succeeded" and ticket.result is not None:
        artifacts.append(
            {
                "artifactId": "result",
                "name": "result",
                "parts": [{"data": ticket.result, "mediaType": "application/json"}],
            }
        )
    for i, stored in enumerate(ticket.artifacts or []):
        artifacts.append(
            {
                "artifactId": f"artifact-{i}",
                "name": stored.get("uri", ""),
                "parts": [
                    {
                        "url": stored.get("uri", ""),
                        "mediaType": stored.get("media_type") or "application/octet-stream",
                    }
                ],
                "metadata": {"sha256": stored.get("sha256"), "bytes": stored.get("bytes")},
            }
        )
    if artifacts:
        task["artifacts"] = artifacts
    # Through the SDK's type: what we answer is what its client parses.
    return MessageToDict(ParseDict(task, pb.Task()))


def _send_params(params: dict[str, Any]):
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import ParseDict, ParseError

    try:
        return ParseDict(params, pb.SendMessageRequest(), ignore_unknown_fields=True)
    except ParseError as exc:
        raise RpcError(INVALID_PARAMS, f"params: {exc}") from exc


def _admit(request: HttpRequest, endpoint, params: dict[str, Any], *, wait_s: float | None):
    """Admit the message's ticket through the API's own route function:
    the message id is the dedupe key, the submitter the key's user."""
    from tickets import api as ticket_api
    from tickets import selectors

    send = _send_params(params)
    message = send.message
    if message.task_id:
        raise RpcError(
            UNSUPPORTED,
            "a message starts a new task (a ticket is one piece of work); "
            "name earlier tasks in referenceTaskIds",
        )
    requester: dict[str, Any] = {"name": "a2a"}
    if send.configuration.HasField("task_push_notification_config"):
        requester["webhook_url"] = _push_url(send.configuration.task_push_notification_config)
    a2a_meta: dict[str, Any] = {}
    if message.context_id:
        a2a_meta["context_id"] = message.context_id
    if message.reference_task_ids:
        a2a_meta["reference_task_ids"] = list(message.reference_task_ids)
    try:
        payload = ticket_api.TicketIn(
            endpoint=endpoint.address,
            dedupe_key=message.message_id or None,
            input=message_input(message),
            requester={**requester, "metadata": {"a2a": a2a_meta}},
            wait_s=wait_s,
        )
    except ValidationError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from exc
    if not message.message_id:
        raise RpcError(INVALID_PARAMS, "message.messageId is required: it is the dedupe key")
    answer = ticket_api.create_ticket(request, payload)
    return selectors.get_ticket(json.loads(answer.content)["id"])


def _push_url(config) -> str:
    """A push notification config given with the message: its URL becomes
    the ticket's webhook (``requester.webhook_url``), the ledger's delivery
    of each terminal state: signed (Standard Webhooks), retried, held for an
    owner's approval where the endpoint requires one, and only to hosts
    ``DELIVERY_ALLOWED_HOSTS`` permits (the API checks the URL)."""
    if not config.url:
        raise RpcError(INVALID_PARAMS, "taskPushNotificationConfig.url is required")
    if config.token or config.HasField("authentication"):
        raise RpcError(
            INVALID_PARAMS,
            "taskPushNotificationConfig: token and authentication are not sent; a delivery "
            "is signed instead (verify its webhook-signature header, docs/reference/api.md)",
        )
    return config.url


def push_config(ticket) -> dict[str, Any] | None:
    url = (ticket.requester or {}).get("webhook_url")
    if not url:
        return None
    return {"id": "webhook", "taskId": str(ticket.id), "url": url}


def _task_id(params: dict[str, Any], field: str = "id") -> str:
    task_id = params.get(field) if isinstance(params, dict) else None
    if not isinstance(task_id, str) or not task_id:
        raise RpcError(INVALID_PARAMS, f"params.{field} (the task's id) is required")
    return task_id


def _visible(request: HttpRequest, endpoint, task_id: str):
    """The caller's task on this agent; anything else is "task not found"."""
    from tickets import selectors

    try:
        ticket = selectors.get_visible_ticket(task_id, user=request.user)
    except (DomainError, Http404, ValueError) as exc:
        raise RpcError(TASK_NOT_FOUND, "task not found") from exc
    if ticket.endpoint_id != endpoint.id:
        raise RpcError(TASK_NOT_FOUND, "task not found")
    return ticket


def send_message(request, endpoint, params) -> dict[str, Any]:
    """``SendMessage``: admit, and unless ``returnImmediately`` wait (a wait
    slot permitting) for a terminal state, as the API's ``wait_s``."""
    send = _send_params(params)
    wait_s = None
    if not send.configuration.return_immediately:
        wait_s = min(SEND_WAIT_S, settings.ADMISSION_MAX_WAIT_S)
    ticket = _admit(request, endpoint, params, wait_s=wait_s)
    return {"task": task_dict(ticket)}


def get_task(request, endpoint, params) -> dict[str, Any]:
    from tickets import selectors

    ticket = _visible(request, endpoint, _task_id(params))
    return task_dict(selectors.get_ticket(ticket.id))


def cancel_task(request, endpoint, params) -> dict[str, Any]:
    """``CancelTask``: the API's cancel (queued -> canceled at once; a
    running turn is asked to stop and the task stays working until it has)."""
    from runtime import services
    from tickets import selectors
    from tickets.api import actor_of

    ticket = _visible(request, endpoint, _task_id(params))
    try:
        services.cancel_ticket(ticket_id=ticket.id, actor=actor_of(request))
    except DomainError as exc:
        raise rpc_error(exc, task=True) from exc
    return task_dict(selectors.get_ticket(ticket.id))


def get_push_config(request, endpoint, params) -> dict[str, Any]:
    """``GetTaskPushNotificationConfig``: the ticket's webhook, the one
    config a task has (id ``webhook``)."""
    ticket = _visible(request, endpoint, _task_id(params, "taskId"))
    config = push_config(ticket)
    if config is None or params.get("id") not in (None, "", "webhook"):
        raise RpcError(TASK_NOT_FOUND, "the task has no such push notification config")
    return config


def list_push_configs(request, endpoint, params) -> dict[str, Any]:
    ticket = _visible(request, endpoint, _task_id(params, "taskId"))
    config = push_config(ticket)
    return {"configs": [config] if config else []}


def change_push_config(request, endpoint, params) -> dict[str, Any]:
    raise RpcError(
        PUSH_NOT_SUPPORTED,
        "a task's push notification is set with the message that starts it "
        "(SendMessage's configuration.taskPushNotificationConfig): a ticket's "
        "webhook does not change after admission",
    )


METHODS = {
    "SendMessage": send_message,
    "GetTask": get_task,
    "CancelTask": cancel_task,
    "GetTaskPushNotificationConfig": get_push_config,
    "ListTaskPushNotificationConfigs": list_push_configs,
    "CreateTaskPushNotificationConfig": change_push_config,
    "DeleteTaskPushNotificationConfig": change_push_config,
}
STREAMING = ("SendStreamingMessage", "SubscribeToTask")
NOT_SERVED = ("ListTasks", "GetExtendedAgentCard")


# --- The 0.3 names --------------------------------------------------------------------------------
#
# A2A 0.3 clients (``message/send``, lower-case states, ``kind`` fields) reach
# the same methods: their request is parsed with the SDK's 0.3 models and
# converted by its own compatibility layer, and every answer converted back.

V03_METHODS = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
}


def v03_params(method: str, body: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 request's params as the 1.0 method's."""
    from a2a.compat.v0_3 import conversions as to
    from a2a.compat.v0_3 import types as v03
    from google.protobuf.json_format import MessageToDict

    model, convert = {
        "message/send": (v03.SendMessageRequest, to.to_core_send_message_request),
        "message/stream": (v03.SendStreamingMessageRequest, to.to_core_send_message_request),
        "tasks/get": (v03.GetTaskRequest, to.to_core_get_task_request),
        "tasks/cancel": (v03.CancelTaskRequest, to.to_core_cancel_task_request),
        "tasks/resubscribe": (v03.TaskResubscriptionRequest, to.to_core_subscribe_to_task_request),
        "tasks/pushNotificationConfig/get": (
            v03.GetTaskPushNotificationConfigRequest,
            to.to_core_get_task_push_notification_config_request,
        ),
        "tasks/pushNotificationConfig/list": (
            v03.ListTaskPushNotificationConfigRequest,
            to.to_core_list_task_push_notification_config_request,
        ),
    }.get(method, (None, None))
    if model is None:  # set and delete: refused whatever they carry
        return {}
    try:
        return MessageToDict(convert(model.model_validate(body)))
    except (ValidationError, ValueError, TypeError) as exc:
        raise RpcError(INVALID_PARAMS, f"params: {exc}") from exc


def v03_result(method: str, result: dict[str, Any]) -> Any:
    """A 1.0 method's result (or stream event) in 0.3's shape."""
    from a2a.compat.v0_3 import conversions as to
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import ParseDict

    if "task" in result and method in ("message/send", "message/stream", "tasks/resubscribe"):
        converted = to.to_compat_task(ParseDict(result["task"], pb.Task()))
    elif "statusUpdate" in result:
        event = ParseDict(result["statusUpdate"], pb.TaskStatusUpdateEvent())
        converted = to.to_compat_task_status_update_event(event)
    elif "artifactUpdate" in result:
        event = ParseDict(result["artifactUpdate"], pb.TaskArtifactUpdateEvent())
        converted = to.to_compat_task_artifact_update_event(event)
    elif method in ("tasks/get", "tasks/cancel"):
        converted = to.to_compat_task(ParseDict(result, pb.Task()))
    elif method == "tasks/pushNotificationConfig/get":
        config = ParseDict(result, pb.TaskPushNotificationConfig())
        converted = to.to_compat_task_push_notification_config(config)
    elif method == "tasks/pushNotificationConfig/list":
        listed = ParseDict(result, pb.ListTaskPushNotificationConfigsResponse())
        return [
            to.to_compat_task_push_notification_config(c).model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
            for c in listed.configs
        ]
    else:
        raise ValueError(f"no 0.3 shape for {method}")
    return converted.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- Streams ------------------------------------------------------------------------------------


def _sse(request_id: Any, result: dict[str, Any], shape) -> str:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": shape(result)})
    return f"data: {body}\n\n"


def _status_event(task: dict[str, Any]) -> dict[str, Any]:
    event = {"taskId": task["id"], "contextId": task["contextId"], "status": task["status"]}
    if task.get("metadata"):
        event["metadata"] = task["metadata"]
    return {"statusUpdate": event}


def task_events(request, request_id: Any, ticket_id, shape) -> Iterator[str]:
    """``_changes``, ended quietly by a transient fault: the stream's 200 is
    already sent, so the reader sees the stream end and subscribes again
    (every state is the ledger's, read afresh then)."""
    from core.transient import TRANSIENT_ERRORS, describe, drop_broken_connection

    try:
        yield from _changes(request, request_id, ticket_id, shape)
    except TRANSIENT_ERRORS as exc:
        drop_broken_connection()
        log.warning("a2a stream of %s ended by a transient fault: %s", ticket_id, describe(exc))


def _changes(request, request_id: Any, ticket_id, shape) -> Iterator[str]:
    """Step 3 of the module docstring: the task, then each change until a
    terminal state (the result as an artifact update before its status)."""
    from core import fairshare
    from tickets import selectors, waits

    ticket = selectors.get_ticket(ticket_id)
    task = task_dict(ticket)
    yield _sse(request_id, {"task": task}, shape)
    if task["status"]["state"] in TERMINAL_TASK_STATES:
        return
    with fairshare.wait_slot(request.user) as granted:
        if not granted:
            log.info("a2a stream of %s ended at once: no free wait slot", ticket_id)
            return
        deadline = time.monotonic() + STREAM_MAX_S
        key = str(ticket_id)
        token = selectors.change_token(ticket_id)
        last = task
        while (left := deadline - time.monotonic()) > 0:
            woke = waits.wait_for_change(
                key, token, lambda: selectors.change_token(ticket_id), min(left, KEEPALIVE_S)
            )
            if woke is None:  # no listener (a database restart): look again shortly
                time.sleep(1.0)
                changed = True
            else:
                token, changed = woke
            if not changed:
                yield ": keep-alive\n\n"
                continue
            task = task_dict(selectors.get_ticket(ticket_id))
            if (task["status"]["state"], task.get("metadata")) == (
                last["status"]["state"],
                last.get("metadata"),
            ):
                continue
            last = task
            if task["status"]["state"] in TERMINAL_TASK_STATES:
                for artifact in task.get("artifacts", []):
                    update = {
                        "taskId": task["id"],
                        "contextId": task["contextId"],
                        "artifact": artifact,
                        "lastChunk": True,
                    }
                    yield _sse(request_id, {"artifactUpdate": update}, shape)
                yield _sse(request_id, _status_event(task), shape)
                return
            yield _sse(request_id, _status_event(task), shape)


def stream(request, endpoint, method: str, params, request_id, shape) -> HttpResponse:
    if method == "SendStreamingMessage":
        ticket_id = _admit(request, endpoint, params, wait_s=None).id
    else:
        ticket_id = _visible(request, endpoint, _task_id(params)).id
    response = StreamingHttpResponse(
        task_events(request, request_id, ticket_id, shape), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-store"
    # A buffering proxy (deploy/nginx.conf) passes each event at once.
    response["X-Accel-Buffering"] = "no"
    return response


# --- The JSON-RPC door --------------------------------------------------------------------------


def _same(result: dict[str, Any]) -> dict[str, Any]:
    return result


@csrf_exempt
def a2a_view(request: HttpRequest, address: str) -> HttpResponse:
    """``POST /a2a/<address>``: one JSON-RPC request (no batches)."""
    from core.middleware import body_too_large

    if request.method != "POST":
        return error_response(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed on an A2A agent: POST JSON-RPC requests",
            headers={"Allow": "POST"},
        )
    refused = _caller(request)
    if refused is not None:
        return refused
    too_large = body_too_large(request)
    if too_large is not None:
        return too_large
    endpoint = _agent(request, address)
    if endpoint is None:
        return _no_agent(address)
    request_id = None
    try:
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            raise RpcError(PARSE_ERROR, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
            raise RpcError(INVALID_REQUEST, "one JSON-RPC 2.0 request object is expected")
        request_id = body.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, str | int | type(None)):
            request_id = None
            raise RpcError(INVALID_REQUEST, "id must be a string, an integer or null")
        method, params = body.get("method"), body.get("params", {})
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        shape = _same
        if method in V03_METHODS:
            asked = method
            method, params = V03_METHODS[asked], v03_params(asked, body)
            shape = functools.partial(v03_result, asked)
        if method in STREAMING:
            try:
                return stream(request, endpoint, method, params, request_id, shape)
            except (DomainError, Http404) as exc:
                raise rpc_error(exc, task=method == "SubscribeToTask") from exc
        handler = METHODS.get(method)
        if handler is None:
            if method in NOT_SERVED:
                raise RpcError(UNSUPPORTED, f"{method} is not served (docs/howto/a2a.md)")
            raise RpcError(METHOD_NOT_FOUND, f"no method {method!r}")
        try:
            result = handler(request, endpoint, params)
        except (DomainError, Http404) as exc:
            raise rpc_error(exc, task=method != "SendMessage") from exc
        answer = {"jsonrpc": "2.0", "id": request_id, "result": shape(result)}
    except RpcError as exc:
        log.info("a2a %s: %s %s", address, exc.code, exc.message)
        answer = exc.body(request_id)
    response = JsonResponse(answer)
    response["Cache-Control"] = "no-store"
    return response
