"""The asyncio client: the same calls and retry rules as ``Client``."""

from __future__ import annotations

import asyncio
import builtins  # the clients have a list() method
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from . import _common, _sse
from ._retry import Attempts, RetryPolicy
from ._sse import Step
from .client import IdLike
from .errors import ClaimcheckError, InvalidTransition
from .models import Event, Lineage, ReturnTo, Ticket, Turn


class AsyncClient:
    """``async with AsyncClient(url, key) as cc: t = await cc.submit(...)``;
    see ``Client`` for the parameters and the retry rules."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff_base: float = 0.25,
        backoff_cap: float = 10.0,
        max_retry_after: float = 60.0,
        max_wait_s: float = _common.SERVER_MAX_WAIT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_wait_s = max_wait_s
        self.policy = RetryPolicy(
            retries=retries,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            max_retry_after=max_retry_after,
        )
        self._http = httpx.AsyncClient(
            base_url=_common.api_root(base_url),
            headers=_common.headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        attempts = Attempts(self.policy)
        while True:
            try:
                response = await self._http.request(
                    method,
                    path,
                    json=json,
                    params={k: v for k, v in (params or {}).items() if v is not None},
                    timeout=timeout if timeout is not None else self.timeout,
                )
            except httpx.TransportError as exc:
                delay = attempts.on_transport_error(exc)
                if delay is None:
                    raise attempts.raise_transport(exc) from exc
                await asyncio.sleep(delay)
                continue
            delay = attempts.on_response(response)
            if delay is not None:
                await asyncio.sleep(delay)
                continue
            return attempts.finish(response).json()

    async def submit(
        self,
        endpoint: str,
        input: Mapping[str, Any],  # noqa: A002 - the API's name
        *,
        dedupe_key: str | None = None,
        parent: IdLike | None = None,
        trace_id: str | None = None,
        return_to: str | ReturnTo | Mapping[str, Any] | None = None,
        requester: Mapping[str, Any] | None = None,
        wait_s: float | None = None,
        budget: Mapping[str, Any] | None = None,
    ) -> Ticket:
        body = _common.submission(
            endpoint=endpoint,
            input=input,
            dedupe_key=dedupe_key if dedupe_key is not None else _common.new_dedupe_key(),
            parent=parent,
            trace_id=trace_id,
            return_to=return_to,
            requester=requester,
            wait_s=wait_s,
            budget=budget,
        )
        data = await self._request(
            "POST", "/tickets", json=body, timeout=self.timeout + (wait_s or 0)
        )
        return Ticket.from_json(data)

    async def get(self, ticket_id: IdLike) -> Ticket:
        return Ticket.from_json(await self._request("GET", f"/tickets/{ticket_id}"))

    async def list_page(
        self,
        *,
        endpoint: str | None = None,
        state: str | None = None,
        trace_id: str | None = None,
        search: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[builtins.list[Ticket], str | None]:
        data = await self._request(
            "GET",
            "/tickets",
            params={
                "endpoint": endpoint,
                "state": state,
                "trace_id": trace_id,
                "search": search,
                "limit": limit,
                "cursor": cursor,
            },
        )
        return [Ticket.from_json(t) for t in data["items"]], data.get("next_cursor")

    async def list(
        self,
        *,
        endpoint: str | None = None,
        state: str | None = None,
        trace_id: str | None = None,
        search: str | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Ticket]:
        cursor: str | None = None
        while True:
            items, cursor = await self.list_page(
                endpoint=endpoint,
                state=state,
                trace_id=trace_id,
                search=search,
                limit=page_size,
                cursor=cursor,
            )
            for item in items:
                yield item
            if not cursor:
                return

    async def events(self, ticket_id: IdLike) -> builtins.list[Event]:
        data = await self._request("GET", f"/tickets/{ticket_id}/events")
        return [Event.from_json(e) for e in data]

    async def stream(
        self, ticket_id: IdLike, last_event_id: int | None = None
    ) -> AsyncIterator[Step]:
        """``Client.stream``'s async twin: the ticket's steps, resumed with
        ``Last-Event-ID`` after a dropped connection, until ``end``."""
        stream = _sse.Resume(self.policy, last_event_id)
        timeout = httpx.Timeout(self.timeout, read=_sse.READ_TIMEOUT_S)
        while True:
            try:
                async with self._http.stream(
                    "GET",
                    f"/tickets/{ticket_id}/stream",
                    headers=stream.request(),
                    timeout=timeout,
                ) as response:
                    if not response.is_success:
                        await response.aread()
                        await asyncio.sleep(stream.on_response(response))
                        continue
                    async for line in response.aiter_lines():
                        if (step := stream.feed(line)) is not None:
                            yield step
                            if stream.done:
                                return
            except httpx.TransportError as exc:
                await asyncio.sleep(stream.on_transport_error(exc))
                continue
            await asyncio.sleep(stream.on_close())

    async def lineage(self, ticket_id: IdLike) -> Lineage:
        return Lineage.from_json(await self._request("GET", f"/tickets/{ticket_id}/lineage"))

    async def cancel(self, ticket_id: IdLike) -> Ticket:
        try:
            data = await self._request("POST", f"/tickets/{ticket_id}/cancel")
        except ClaimcheckError as exc:
            if _common.already_done(exc, state="cancelled"):
                return await self.get(ticket_id)
            raise
        return Ticket.from_json(data)

    async def ack(self, ticket_id: IdLike) -> Ticket:
        try:
            data = await self._request("POST", f"/tickets/{ticket_id}/delivery/ack", json={})
        except ClaimcheckError as exc:
            if _common.already_done(exc, delivery="delivered"):
                return await self.get(ticket_id)
            raise
        return Ticket.from_json(data)

    async def retry(
        self,
        ticket_id: IdLike,
        *,
        reason: str,
        input: dict[str, Any] | None = None,  # noqa: A002 - the API's name
        budget_s: int | None = None,
    ) -> Ticket:
        """Retry a failed, cancelled or orphaned ticket as a new ticket
        (``retry_of`` names the original); ``input`` and ``budget_s``
        (at most the endpoint's budget) change what the retry runs. A ticket
        is retried once: after an attempt whose answer was lost, the 409
        "already retried" is answered with that retry."""
        body: dict[str, Any] = {"reason": reason}
        if input is not None:
            body["input"] = input
        if budget_s is not None:
            body["budget_s"] = budget_s
        try:
            data = await self._request("POST", f"/tickets/{ticket_id}/retry", json=body)
        except ClaimcheckError as exc:
            if exc.ambiguous and isinstance(exc, InvalidTransition):
                original = await self.get(ticket_id)
                if original.retry:
                    return await self.get(original.retry)
            raise
        return Ticket.from_json(data)

    async def approve(self, ticket_id: IdLike) -> Ticket:
        return Ticket.from_json(await self._request("POST", f"/tickets/{ticket_id}/approve"))

    async def turn(self, turn_id: IdLike) -> Turn:
        return Turn.from_json(await self._request("GET", f"/turns/{turn_id}"))

    async def wait(self, ticket_id: IdLike, timeout: float) -> Ticket:
        """See ``Client.wait``."""
        deadline = time.monotonic() + timeout
        ticket = await self.get(ticket_id)
        long_poll = ticket.dedupe_key is not None
        pause = 0.2
        while not ticket.is_terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if long_poll:
                wait_s, asked = min(left, self.max_wait_s), time.monotonic()
                try:
                    data = await self._request(
                        "POST",
                        "/tickets",
                        json=_common.long_poll_body(ticket, wait_s),
                        timeout=self.timeout + wait_s,
                    )
                except _common.LONG_POLL_GIVE_UP:
                    long_poll = False
                    continue
                polled = Ticket.from_json(data)
                if polled.id == ticket.id:
                    ticket = polled
                    if ticket.is_terminal or not _common.answered_early(asked, wait_s):
                        continue
                    # No wait slot was free on the server: pause, never a tight loop.
                    await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(pause * 2, 5.0)
                    continue
                long_poll = False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 5.0)
            ticket = await self.get(ticket_id)
        return dataclasses.replace(ticket, duplicate=False)
