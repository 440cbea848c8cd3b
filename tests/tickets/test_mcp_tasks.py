"""MCP Tasks at /mcp (config/mcp_tasks.py, docs/reference/mcp.md "Tasks"): the
``io.modelcontextprotocol/tasks`` extension through the official ``mcp``
client over real HTTP, on real PostgreSQL, with a real worker where a ticket
must run. As in test_mcp.py, the ledger is set up before the client's event
loop runs and read after it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, TypeAdapter

from tests.tickets.test_mcp import key_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = {"completed", "failed", "cancelled"}


class TaskHandle(types.Result):
    """``CreateTaskResult``: ``resultType: "task"`` and the seed task."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_seconds: int | None = None
    poll_interval_milliseconds: int | None = None


class GetTask(types.Request[types.GetTaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: types.GetTaskRequestParams
    name_param = "taskId"  # the extension's Mcp-Name routing header


class CancelTask(types.Request[types.CancelTaskRequestParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: types.CancelTaskRequestParams
    name_param = "taskId"


class TaskResult(types.Request[types.GetTaskPayloadRequestParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: types.GetTaskPayloadRequestParams
    name_param = "taskId"


ANY = TypeAdapter(dict[str, Any])


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    return await client.session.send_request(
        GetTask(params=types.GetTaskRequestParams(task_id=task_id)), ANY
    )


async def poll(client: Client, task_id: str, until: set[str], deadline_s: float = 90) -> dict:
    """tasks/get at the task's own poll interval until its status is one of
    ``until`` (a deadline, not a sleep, bounds the wait)."""
    deadline = time.monotonic() + deadline_s
    while True:
        task = await get_task(client, task_id)
        if task["status"] in until or time.monotonic() > deadline:
            return task
        await asyncio.sleep(task["pollIntervalMilliseconds"] / 1000)


class Tasks(ClientExtension):
    """The requestor's side: declares the extension on every request and
    finishes a task handle by polling tasks/get (what a host does)."""

    identifier = EXTENSION

    def claims(self):
        async def resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
            task_id = handle.task_id
            while True:
                task = await ctx.session.send_request(
                    GetTask(params=types.GetTaskRequestParams(task_id=task_id)), ANY
                )
                if task["status"] == "completed":
                    return types.CallToolResult.model_validate(task["result"])
                if task["status"] in TERMINAL:
                    raise MCPError(-32000, f"task {task['status']}", task.get("error"))
                await asyncio.sleep(task["pollIntervalMilliseconds"] / 1000)

        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


@contextlib.asynccontextmanager
async def connect(
    url: str, key: str, tasks: bool = True, mode: str = "auto"
) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=90)
        ) as http,
        Client(
            streamable_http_client(f"{url}/mcp", http_client=http),
            extensions=[Tasks()] if tasks else [],
            mode=mode,
        ) as client,
    ):
        yield client


async def submit(client: Client, **arguments: Any) -> TaskHandle | types.CallToolResult:
    """submit_ticket, receiving a task handle as it comes (not resolved)."""
    return await client.session.call_tool("submit_ticket", arguments, allow_claimed=True)


def test_a_task_outlives_its_session_and_its_result_is_read_in_a_new_one(
    celery_procs, live_server, make_endpoint, django_user_model
):
    django_user_model.objects.create_user("alice")
    make_endpoint("tasks.echo", owners=["alice"])
    alice = key_of("alice")
    args = {"endpoint": "tasks.echo", "input": {"n": 1}, "dedupe_key": "task-1"}

    async def first_session() -> TaskHandle:
        async with connect(live_server.url, alice) as client:
            assert EXTENSION in (client.server_capabilities.extensions or {})
            # No worker yet: the ticket is queued when the call answers, so
            # the server answers with a task whose id is the ticket's.
            handle = await submit(client, **args)
            assert isinstance(handle, TaskHandle), handle
            assert handle.status == "working" and handle.ttl_seconds is None
            # The same dedupe key again is the same task, not a second one.
            again = await submit(client, **args)
            assert isinstance(again, TaskHandle) and again.task_id == handle.task_id
            task = await get_task(client, handle.task_id)
            assert (task["status"], task["_meta"]["io.claimcheck/ticket"]) == (
                "working",
                {"state": "queued"},
            )
            # The session ends here, with the task still working.
            return handle

    handle = asyncio.run(first_session())
    from tickets.models import Ticket

    assert Ticket.objects.filter(dedupe_key="task-1").count() == 1
    assert str(Ticket.objects.get(dedupe_key="task-1").id) == handle.task_id

    celery_procs.worker()

    async def second_session() -> dict[str, Any]:
        async with connect(live_server.url, alice) as client:
            done = await poll(client, handle.task_id, TERMINAL)
            # The SEP-2663 result retrieval is tasks/get's inlined result;
            # the 2025 tasks/result is gone (-32601, as the extension requires).
            with pytest.raises(MCPError) as gone:
                await client.session.send_request(
                    TaskResult(params=types.GetTaskPayloadRequestParams(task_id=handle.task_id)),
                    ANY,
                )
            assert gone.value.code == -32601
            # A host that lets the client finish the task itself gets the
            # ordinary tool result: the finished ticket.
            final = await client.call_tool("submit_ticket", args)
            return {"task": done, "final": final.structured_content}

    seen = asyncio.run(second_session())
    task = seen["task"]
    assert task["status"] == "completed", task
    assert task["resultType"] == "complete"
    ticket = task["result"]["structuredContent"]
    assert (ticket["id"], ticket["state"], ticket["result"]) == (
        handle.task_id,
        "succeeded",
        {"echo": {"n": 1}},
    )
    assert task["result"]["isError"] is False
    # A finished ticket is answered at once: no task for it.
    assert seen["final"]["id"] == handle.task_id and seen["final"]["state"] == "succeeded"


def test_cancel_a_task_and_a_strangers_task_is_not_found(
    live_server, make_endpoint, django_user_model
):
    for name in ("alice", "mallory"):
        django_user_model.objects.create_user(name)
    make_endpoint("tasks.idle", owners=["alice"])  # no worker: its tickets stay queued
    alice, mallory = key_of("alice"), key_of("mallory")

    async def as_alice() -> tuple[str, str]:
        async with connect(live_server.url, alice) as client:
            handle = await submit(client, endpoint="tasks.idle", input={}, dedupe_key="c")
            kept = await submit(client, endpoint="tasks.idle", input={}, dedupe_key="k")
            assert isinstance(handle, TaskHandle) and isinstance(kept, TaskHandle)
            return handle.task_id, kept.task_id

    cancelled_id, kept_id = asyncio.run(as_alice())

    async def as_mallory() -> None:
        async with connect(live_server.url, mallory) as client:
            unknown = "00000000-0000-4000-8000-000000000000"
            for task_id in (kept_id, unknown, "not-a-uuid"):
                with pytest.raises(MCPError) as missing:
                    await get_task(client, task_id)
                assert (missing.value.code, missing.value.error.message) == (
                    -32602,
                    "Failed to retrieve task: Task not found",
                ), task_id
                # Cancel acknowledges any id (the extension's rule) and
                # changes nothing that is not the caller's.
                ack = await client.session.send_request(
                    CancelTask(params=types.CancelTaskRequestParams(task_id=task_id)), ANY
                )
                assert ack["resultType"] == "complete"

    asyncio.run(as_mallory())

    async def cancel_as_alice() -> tuple[dict, dict]:
        async with connect(live_server.url, alice) as client:
            await client.session.send_request(
                CancelTask(params=types.CancelTaskRequestParams(task_id=cancelled_id)), ANY
            )
            # Cancelling a finished task is acknowledged too.
            await client.session.send_request(
                CancelTask(params=types.CancelTaskRequestParams(task_id=cancelled_id)), ANY
            )
            return await get_task(client, cancelled_id), await get_task(client, kept_id)

    cancelled, kept = asyncio.run(cancel_as_alice())
    assert cancelled["status"] == "cancelled" and "result" not in cancelled
    assert cancelled["_meta"]["io.claimcheck/ticket"] == {"state": "cancelled"}
    assert kept["status"] == "working"  # Mallory's cancel did nothing
    from tickets.models import Ticket, TicketEvent

    assert Ticket.objects.get(id=kept_id).state == "queued"
    assert [
        e.actor for e in TicketEvent.objects.filter(ticket_id=cancelled_id, to_state="cancelled")
    ] == ["user:alice"]


def test_without_the_extension_submit_answers_as_before(live_server, make_endpoint, api_key):
    make_endpoint("tasks.plain")
    args = {"endpoint": "tasks.plain", "input": {}, "dedupe_key": "p"}

    async def calls() -> list[Any]:
        async with connect(live_server.url, api_key, tasks=False) as client:
            plain = await client.session.call_tool("submit_ticket", args, allow_claimed=True)
        # The 2025 revisions have no extensions: no task, and no tasks/* methods.
        async with connect(live_server.url, api_key, mode="legacy") as client:
            legacy = await client.session.call_tool("submit_ticket", args, allow_claimed=True)
            with pytest.raises(MCPError) as gone:
                await get_task(client, plain.structured_content["id"])
        return [plain, legacy, gone.value.code]

    plain, legacy, code = asyncio.run(calls())
    assert isinstance(plain, types.CallToolResult) and not plain.is_error
    assert plain.structured_content["state"] == "queued"
    assert isinstance(legacy, types.CallToolResult) and legacy.structured_content["duplicate"]
    assert code == -32601


def test_the_docs_tasks_example_runs(worker, live_server, make_endpoint, api_key, capsys):
    """docs/reference/mcp.md's tasks example, as written, against a live server (its
    key and URL are the only lines changed)."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "reference" / "mcp.md").read_text()
    section = doc[doc.index("## Tasks (") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```\n")]
    for line, replacement in (
        ('KEY = open("var/demo_api_key").read().strip()', f"KEY = {api_key!r}"),
        ('URL = "http://127.0.0.1:8000/mcp"', f"URL = {live_server.url + '/mcp'!r}"),
    ):
        assert line in code, line
        code = code.replace(line, replacement)
    make_endpoint("demo.sleep", path="runtime.demo.sleep")

    # As a script runs it: without this module's postponed annotations.
    exec(
        compile(code, "docs/reference/mcp.md", "exec", dont_inherit=True),
        {"__name__": "docs_example"},
    )

    printed = capsys.readouterr().out.splitlines()
    task_id = printed[0].split()[1]
    assert printed[0] == f"task {task_id} working", printed
    assert printed[1].startswith("completed {'slept_s': "), printed
    assert printed[2] == "succeeded", printed


AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


def test_ticket_states_map_onto_task_statuses(live_server, make_endpoint, django_user_model):
    """Each ticket reaches its state by the runtime's own steps (its turn
    run in this process), then tasks/get reads it."""
    pytest.importorskip("pydantic_ai")
    from runtime import turns as runtime
    from tests.client.conftest import Ledger
    from tickets.models import Ticket

    django_user_model.objects.create_user("alice")
    make_endpoint("demo.echo", owners=["alice"])
    make_endpoint("demo.fail", path="runtime.demo.fail", owners=["alice"])
    make_endpoint("demo.agent", runner=AGENT, owners=["alice"])
    make_endpoint(
        "tasks.stuck", path="runtime.demo.stuck", interrupt_grace_s=0.05, owners=["alice"]
    )
    alice = key_of("alice")
    asks = {
        "failed": ("demo.fail", {}),
        "approval": ("demo.agent", {"prompt": "send ops"}),
        "delegated": ("demo.agent", {"prompt": "delegate a"}),
    }

    async def submit_all() -> dict[str, str]:
        async with connect(live_server.url, alice) as client:
            ids = {}
            for name, (endpoint, input_) in asks.items():
                handle = await submit(client, endpoint=endpoint, input=input_, dedupe_key=name)
                assert isinstance(handle, TaskHandle), (name, handle)
                ids[name] = handle.task_id
            return ids

    ids = asyncio.run(submit_all())
    for name in asks:
        runtime.run_ticket(ticket_id=ids[name])
    assert {n: Ticket.objects.get(id=i).state for n, i in ids.items()} == {
        "failed": "failed",
        "approval": "waiting",
        "delegated": "waiting",
    }
    case = Ledger().quarantine("tasks.stuck")
    ids["recovering"] = str(Ticket.objects.get(endpoint__address="tasks.stuck").id)

    async def read_all() -> dict[str, dict]:
        async with connect(live_server.url, alice) as client:
            return {name: await get_task(client, task_id) for name, task_id in ids.items()}

    tasks = asyncio.run(read_all())
    failed = tasks["failed"]
    assert failed["status"] == "failed" and "result" not in failed
    assert failed["error"]["code"] == -32000
    assert failed["error"]["data"]["ticket"]["error"] == Ticket.objects.get(id=ids["failed"]).error
    approval = tasks["approval"]
    assert (approval["status"], approval["inputRequests"]) == ("input_required", {})
    assert "owner's approval" in approval["statusMessage"]
    assert tasks["delegated"]["status"] == "working"
    assert "delegated" in tasks["delegated"]["statusMessage"]
    recovering = tasks["recovering"]
    assert recovering["status"] == "working"
    assert recovering["_meta"]["io.claimcheck/ticket"] == {"state": "recovering", "case": case}

    # An owner finalises the case: the ticket is orphaned, a failed task
    # naming its case.
    from recovery.services import decide, inspect_case

    owner = django_user_model.objects.get(username="alice")
    inspection = inspect_case(case_id=case, user=owner)
    decide(
        case_id=case,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="nobody knows what the stuck turn did",
    )

    async def read_orphaned() -> dict:
        async with connect(live_server.url, alice) as client:
            return await get_task(client, ids["recovering"])

    orphaned = asyncio.run(read_orphaned())
    assert orphaned["status"] == "failed", orphaned
    assert orphaned["error"]["data"]["case"] == case
    assert orphaned["_meta"]["io.claimcheck/ticket"] == {"state": "orphaned", "case": case}
