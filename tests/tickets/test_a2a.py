"""The A2A agents at /a2a/<address> (config/a2a.py) through the ``a2a-sdk``
client over real HTTP: pytest-django's live server on real PostgreSQL, and a
real worker where a ticket must run.

The ledger is set up before the client's event loop runs and read after it:
Django's ORM refuses to run inside one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

a2a = pytest.importorskip("a2a", reason="the a2a extra (uv sync --all-extras)")

from a2a.client import ClientConfig, create_client  # noqa: E402
from a2a.types import a2a_pb2 as pb  # noqa: E402
from a2a.utils.errors import (  # noqa: E402
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf.json_format import MessageToDict  # noqa: E402

from claimcheck_client import verify_webhook  # noqa: E402
from tests.client import conftest as client_fixtures  # noqa: E402
from tests.client.conftest import Ledger  # noqa: E402
from tests.conftest import wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The webhook receiver and a worker that may deliver to it (tests/client/).
recorder = client_fixtures.recorder
delivery_worker = client_fixtures.delivery_worker
webhook_secret = client_fixtures.webhook_secret


def key_of(username: str) -> str:
    from accounts.keys import create_api_key

    return create_api_key(username=username)[1]


@contextlib.asynccontextmanager
async def agent(url: str, address: str, key: str, *, streaming: bool = False) -> AsyncIterator:
    """The SDK's client for the agent at ``/a2a/<address>``, its card read
    from the well-known path with ``key`` (as every call sends it)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=90)) as http:
        client = await create_client(
            f"{url}/a2a/{address}",
            client_config=ClientConfig(httpx_client=http, streaming=streaming),
        )
        try:
            yield client
        finally:
            await client.close()


def data_message(message_id: str, data: dict) -> pb.SendMessageRequest:
    message = pb.Message(message_id=message_id, role=pb.ROLE_USER)
    message.parts.add().data.struct_value.update(data)
    return pb.SendMessageRequest(message=message)


async def events_of(stream) -> list[dict]:
    return [MessageToDict(event) async for event in stream]


def test_send_twice_is_one_completed_task_and_a_stranger_finds_nothing(
    worker, live_server, make_endpoint, django_user_model
):
    for name in ("alice", "mallory"):
        django_user_model.objects.create_user(name)
    make_endpoint("demo.echo", notes="Echoes its input back.")
    alice, mallory = key_of("alice"), key_of("mallory")
    url = live_server.url

    async def as_alice() -> tuple[dict, dict]:
        async with agent(url, "demo.echo", alice) as client:
            request = data_message("msg-1", {"hello": "a2a"})
            request.message.context_id = "chat-7"
            (first,) = await events_of(client.send_message(request))
            (again,) = await events_of(client.send_message(data_message("msg-1", {"hello": "a2a"})))
            got = MessageToDict(await client.get_task(pb.GetTaskRequest(id=first["task"]["id"])))
            return first["task"], again["task"], got

    task, again, got = asyncio.run(as_alice())
    # Blocking send: the task comes back completed, its result an artifact.
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["artifacts"][0]["parts"][0]["data"] == {"echo": {"hello": "a2a"}}
    assert task["contextId"] == "chat-7"
    assert task["metadata"]["claimcheck"]["dedupe_key"] == "msg-1"
    # The same message id is the same task: one ticket.
    assert again["id"] == task["id"] == got["id"]
    assert [t["id"] for t in Ledger().tickets(dedupe_key="msg-1")] == [uuid.UUID(task["id"])]

    async def as_mallory() -> None:
        async with agent(url, "demo.echo", mallory) as client:
            for task_id in (task["id"], str(uuid.uuid4()), "not-a-uuid"):
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(pb.GetTaskRequest(id=task_id))
                with pytest.raises(TaskNotFoundError):
                    await client.cancel_task(pb.CancelTaskRequest(id=task_id))

    asyncio.run(as_mallory())


def test_a_streamed_task_runs_to_completion_and_a_resubscribe_after_it_gets_it(
    worker, live_server, make_endpoint, api_key
):
    make_endpoint("demo.sleep", path="runtime.demo.sleep")
    url = live_server.url

    async def stream() -> tuple[list[dict], list[dict]]:
        async with agent(url, "demo.sleep", api_key, streaming=True) as client:
            events = await events_of(
                # Long enough that a reader slowed by a loaded machine still
                # sees the task working before it completes.
                client.send_message(data_message("stream-1", {"seconds": 2.0}))
            )
            task_id = events[0]["task"]["id"]
            later = await events_of(client.subscribe(pb.SubscribeToTaskRequest(id=task_id)))
            return events, later

    events, later = asyncio.run(stream())
    first = events[0]["task"]
    assert first["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    states = [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e]
    assert states[-1] == "TASK_STATE_COMPLETED", events
    assert "TASK_STATE_WORKING" in [first["status"]["state"], *states]
    (artifact,) = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert artifact["taskId"] == first["id"]
    # After the end, a subscription gets the finished task and ends.
    assert [e["task"]["status"]["state"] for e in later] == ["TASK_STATE_COMPLETED"]


def test_cancel_a_queued_task_behind_a_busy_endpoint(worker, live_server, make_endpoint, api_key):
    make_endpoint("demo.sleep", path="runtime.demo.sleep")
    url = live_server.url

    async def busy() -> tuple[dict, dict]:
        async with agent(url, "demo.sleep", api_key) as client:
            running = data_message("busy-1", {"seconds": 30})
            running.configuration.return_immediately = True
            (first,) = await events_of(client.send_message(running))
            queued = data_message("busy-2", {"seconds": 30})
            queued.configuration.return_immediately = True
            (second,) = await events_of(client.send_message(queued))
            cancelled = MessageToDict(
                await client.cancel_task(pb.CancelTaskRequest(id=second["task"]["id"]))
            )
            return first["task"], second["task"], cancelled

    first, second, cancelled = asyncio.run(busy())
    assert second["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    assert Ledger().tickets(dedupe_key="busy-2")[0]["state"] == "cancelled"

    # A finished task cannot be cancelled: the spec's TaskNotCancelable.
    async def again() -> None:
        async with agent(url, "demo.sleep", api_key) as client:
            with pytest.raises(TaskNotCancelableError, match="cancelled"):
                await client.cancel_task(pb.CancelTaskRequest(id=second["id"]))
            await client.cancel_task(pb.CancelTaskRequest(id=first["id"]))

    asyncio.run(again())
    wait_for(
        lambda: Ledger().tickets(dedupe_key="busy-1")[0]["state"] == "cancelled",
        timeout=60,
        message="the running task to stop",
    )


def test_the_agent_card_is_for_callers_who_may_submit(
    live_server, make_endpoint, django_user_model
):
    for name in ("submitter", "stranger"):
        django_user_model.objects.create_user(name)
    make_endpoint("a2a.private", notes="Private work.", submitters={"users": ["submitter"]})
    url = f"{live_server.url}/a2a/a2a.private"
    card_url = f"{url}/.well-known/agent-card.json"

    def get(key: str | None, target: str = card_url) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(target, headers=headers)

    submitter, stranger = key_of("submitter"), key_of("stranger")
    card = get(submitter).json()
    assert card["name"] == "a2a.private"
    assert card["description"] == "Private work."
    assert card["capabilities"]["streaming"] is True
    assert card["supportedInterfaces"] == [
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": version}
        for version in ("1.0", "0.3")
    ]
    # 0.3's own fields, for clients of that revision.
    assert (card["url"], card["protocolVersion"]) == (url, "0.3")
    assert card["skills"][0]["tags"] == ["python"]
    assert "path" not in str(card)  # the runner's settings are the owners'
    # A caller who may not submit finds no agent, exactly like an unknown one.
    for key, target in (
        (stranger, card_url),
        (submitter, f"{url}-nope/.well-known/agent-card.json"),
    ):
        answer = get(key, target)
        assert (answer.status_code, answer.json()["error"]) == (404, "not_found")
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    answer = httpx.post(url, json=body, headers={"Authorization": f"Bearer {stranger}"})
    assert answer.status_code == 404
    # Without a key: 401, before anything is looked up.
    for target in (card_url, url):
        assert httpx.request("GET" if target == card_url else "POST", target).status_code == 401

    async def stranger_reads_the_card() -> None:
        async with agent(live_server.url, "a2a.private", stranger):
            pass

    with pytest.raises(Exception):  # noqa: B017 - the SDK reports the 404 its own way
        asyncio.run(stranger_reads_the_card())


def test_bad_requests_are_json_rpc_errors(live_server, make_endpoint, api_key):
    make_endpoint("a2a.idle")  # no worker: nothing runs
    url = f"{live_server.url}/a2a/a2a.idle"
    headers = {"Authorization": f"Bearer {api_key}"}

    def call(body) -> dict:
        answer = httpx.post(
            url,
            content=body if isinstance(body, bytes) else None,
            json=None if isinstance(body, bytes) else body,
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["error"]

    message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": [1, 2]}]}
    assert call(b"{nope")["code"] == -32700
    assert call([{"jsonrpc": "2.0"}])["code"] == -32600
    assert call({"jsonrpc": "2.0", "id": 1, "method": "Nope"})["code"] == -32601
    assert call({"jsonrpc": "2.0", "id": 1, "method": "ListTasks"})["code"] == -32004
    error = call(
        {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    )
    assert error["code"] == -32602 and "data part" in error["message"]
    no_id = {**message, "messageId": "", "parts": [{"text": "hi"}]}
    error = call({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": no_id}})
    assert error["code"] == -32602 and "messageId" in error["message"]
    # The same message id with another input: the API's dedupe_conflict.
    first = {**message, "parts": [{"text": "one"}]}
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": first, "configuration": {"returnImmediately": True}},
    }
    answer = httpx.post(url, json=send, headers=headers).json()
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    send["params"]["message"] = {**first, "parts": [{"text": "two"}]}
    error = call(send)
    assert error["code"] == -32000 and error["data"]["error"] == "dedupe_conflict"


def test_a_reader_that_disconnects_resubscribes_and_sees_the_end(
    worker, live_server, make_endpoint, api_key
):
    make_endpoint("demo.sleep", path="runtime.demo.sleep")
    url = live_server.url

    async def interrupted() -> tuple[dict, list[dict]]:
        async with agent(url, "demo.sleep", api_key, streaming=True) as client:
            stream = client.send_message(data_message("reconnect-1", {"seconds": 1.5}))
            first = MessageToDict(await anext(stream))
            await stream.aclose()  # the reader goes away mid-turn
        async with agent(url, "demo.sleep", api_key, streaming=True) as client:
            request = pb.SubscribeToTaskRequest(id=first["task"]["id"])
            return first["task"], await events_of(client.subscribe(request))

    first, events = asyncio.run(interrupted())
    assert first["status"]["state"] != "TASK_STATE_COMPLETED"
    assert events[0]["task"]["id"] == first["id"]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED", events
    (update,) = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert update["artifact"]["parts"][0]["data"]["interrupted"] is False


def test_a_result_awaiting_an_owner_is_input_required_until_approved(
    worker, live_server, make_endpoint, django_user_model
):
    for name in ("owner", "caller"):
        django_user_model.objects.create_user(name)
    make_endpoint("a2a.reviewed", owners=["owner"], requires_approval=True)
    owner, caller = key_of("owner"), key_of("caller")
    url = live_server.url

    async def reviewed() -> tuple[dict, list[dict]]:
        async with agent(url, "a2a.reviewed", caller) as client:
            (sent,) = await events_of(client.send_message(data_message("rev-1", {"n": 1})))
        task = sent["task"]
        async with (
            agent(url, "a2a.reviewed", caller, streaming=True) as client,
            httpx.AsyncClient(headers={"Authorization": f"Bearer {owner}"}) as http,
        ):
            events = []
            async for event in client.subscribe(pb.SubscribeToTaskRequest(id=task["id"])):
                events.append(MessageToDict(event))
                if len(events) == 1:  # subscribed: now the owner approves
                    answer = await http.post(f"{url}/api/v1/tickets/{task['id']}/approve")
                    assert answer.status_code == 200, answer.text
            return task, events

    task, events = asyncio.run(reviewed())
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
    assert task["metadata"]["claimcheck"] == {
        "ticket": task["id"],
        "endpoint": "a2a.reviewed",
        "state": "succeeded",
        "dedupe_key": "rev-1",
        "waiting_for": "owner_approval",
    }
    assert events[0]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED", events


def delivery_state(dedupe_key: str) -> str:
    from tickets.models import Ticket

    return Ticket.objects.get(dedupe_key=dedupe_key).delivery_state


def test_a_push_config_is_the_tickets_signed_webhook_delivered_once(
    live_server, make_endpoint, api_key, recorder, delivery_worker, webhook_secret
):
    make_endpoint("a2a.hooked")
    receiver = recorder(200)
    url = live_server.url

    async def pushed() -> tuple[dict, dict, list]:
        async with agent(url, "a2a.hooked", api_key) as client:
            request = data_message("push-1", {"n": 1})
            request.configuration.task_push_notification_config.url = f"{receiver.url}/hook"
            (sent,) = await events_of(client.send_message(request))
            task_id = sent["task"]["id"]
            config = await client.get_task_push_notification_config(
                pb.GetTaskPushNotificationConfigRequest(task_id=task_id, id="webhook")
            )
            listed = await client.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            # A token would never be sent: refused rather than ignored.
            tokened = data_message("push-2", {"n": 2})
            tokened.configuration.task_push_notification_config.url = f"{receiver.url}/hook"
            tokened.configuration.task_push_notification_config.token = "secret"
            with pytest.raises(InvalidParamsError, match="signed"):
                await events_of(client.send_message(tokened))
            return sent["task"], MessageToDict(config), MessageToDict(listed)["configs"]

    task, config, listed = asyncio.run(pushed())
    assert config == {"id": "webhook", "taskId": task["id"], "url": f"{receiver.url}/hook"}
    assert listed == [config]
    wait_for(lambda: delivery_state("push-1") == "delivered", timeout=60, message="the delivery")
    (body,) = receiver.bodies("/hook")  # one delivery for the one terminal state
    _, headers, _ = receiver.requests[0]
    payload = verify_webhook(webhook_secret, headers, body)
    assert payload["ticket"]["id"] == task["id"]
    assert payload["ticket"]["result"] == {"echo": {"n": 1}}


@pytest.mark.django_db
def test_an_outage_is_the_apis_503_and_the_same_message_id_is_safe_to_retry(
    client, api_key, make_endpoint
):
    from tests.test_unavailable import assert_unavailable_json, database_down

    make_endpoint("a2a.down")  # no worker: the ticket stays queued
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "down-1", "role": "ROLE_USER", "parts": [{"text": "x"}]},
            "configuration": {"returnImmediately": True},
        },
    }
    headers = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}

    def post():
        return client.post("/a2a/a2a.down", json.dumps(send), "application/json", **headers)

    with database_down():  # while the key is checked
        assert_unavailable_json(post())
    with database_down(lambda sql: "claimcheck_admit" in sql):  # inside the admission
        assert_unavailable_json(post())
    first, again = post().json(), post().json()
    assert first["result"]["task"]["id"] == again["result"]["task"]["id"]
    assert len(Ledger().tickets(dedupe_key="down-1")) == 1


def test_a_ticket_in_recovery_is_a_failed_task_naming_its_case(live_server, make_endpoint, api_key):
    make_endpoint("a2a.stuck", path="runtime.demo.stuck", interrupt_grace_s=0.05)
    case = Ledger().quarantine("a2a.stuck")
    (ticket,) = Ledger().tickets(endpoint__address="a2a.stuck")
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": str(ticket["id"])}}
    answer = httpx.post(
        f"{live_server.url}/a2a/a2a.stuck",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    task = answer.json()["result"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert task["metadata"]["claimcheck"]["state"] == "recovering"
    assert task["metadata"]["claimcheck"]["recovery"] == {"state": "recovering", "case": case}


def test_the_0_3_method_names_reach_the_same_tasks(live_server, make_endpoint, api_key):
    make_endpoint("a2a.old")  # no worker: the ticket stays submitted
    url = f"{live_server.url}/a2a/a2a.old"
    headers = {"Authorization": f"Bearer {api_key}"}

    def call(method: str, params: dict) -> dict:
        body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    message = {
        "kind": "message",
        "messageId": "old-1",
        "role": "user",
        "parts": [{"kind": "data", "data": {"n": 1}}],
        "contextId": "ctx-old",
    }
    sent = call("message/send", {"message": message, "configuration": {"blocking": False}})
    task = sent["result"]
    assert (task["kind"], task["status"]["state"], task["contextId"]) == (
        "task",
        "submitted",
        "ctx-old",
    )
    # The same message id through the 1.0 name: the same task.
    again = call(
        "SendMessage",
        {
            "message": {"messageId": "old-1", "role": "ROLE_USER", "parts": [{"data": {"n": 1}}]},
            "configuration": {"returnImmediately": True},
        },
    )
    assert again["result"]["task"]["id"] == task["id"]
    assert call("tasks/get", {"id": task["id"]})["result"]["id"] == task["id"]
    cancelled = call("tasks/cancel", {"id": task["id"]})["result"]
    assert cancelled["status"]["state"] == "canceled"
    assert call("tasks/get", {"id": str(uuid.uuid4())})["error"]["code"] == -32001
    with httpx.stream(
        "POST",
        url,
        json={
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tasks/resubscribe",
            "params": {"id": task["id"]},
        },
        headers=headers,
    ) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    (event,) = [json.loads(line[len("data: ") :]) for line in lines]
    assert (event["result"]["kind"], event["result"]["status"]["state"]) == ("task", "canceled")
