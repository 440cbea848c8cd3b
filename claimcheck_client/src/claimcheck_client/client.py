"""The synchronous client."""

from __future__ import annotations

import builtins  # the clients have a list() method
import dataclasses
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from . import _common, _sse
from ._retry import Attempts, RetryPolicy
from ._sse import Step
from .errors import ClaimcheckError, InvalidTransition
from .models import Event, Lineage, ReturnTo, Ticket, Turn

IdLike = str | uuid.UUID


class Client:
    """A Claimcheck API client.

    ``timeout`` bounds one request (a long poll gets its ``wait_s`` on top);
    ``retries`` is how many times an attempt that got no answer (connect
    error, timeout, dropped connection) or a 503 ``unavailable`` is
    repeated, with capped exponential backoff and jitter, honouring
    ``Retry-After``. Errors are typed (``errors.py``).

    >>> with Client("http://127.0.0.1:8000", key) as cc:
    ...     ticket = cc.submit("demo.echo", {"hello": "world"})
    ...     done = cc.wait(ticket.id, timeout=30)
    """

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_wait_s = max_wait_s
        self.policy = RetryPolicy(
            retries=retries,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            max_retry_after=max_retry_after,
        )
        self._http = httpx.Client(
            base_url=_common.api_root(base_url),
            headers=_common.headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    # --- plumbing ----------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
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
                response = self._http.request(
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
                time.sleep(delay)
                continue
            delay = attempts.on_response(response)
            if delay is not None:
                time.sleep(delay)
                continue
            return attempts.finish(response).json()

    # --- tickets -----------------------------------------------------------------------

    def submit(
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
        """Submit work; returns the one ticket for it.

        Without ``dedupe_key`` a random one is made for this call, so a
        repeat after a lost answer (dropped connection, read timeout, 503)
        finds the ticket the first attempt created: the answer is then the
        server's duplicate (``duplicate=True``), never a second ticket. Pass
        your own key to be safe across restarts of the calling process too.
        """
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
        data = self._request("POST", "/tickets", json=body, timeout=self.timeout + (wait_s or 0))
        return Ticket.from_json(data)

    def get(self, ticket_id: IdLike) -> Ticket:
        return Ticket.from_json(self._request("GET", f"/tickets/{ticket_id}"))

    def list_page(
        self,
        *,
        endpoint: str | None = None,
        state: str | None = None,
        trace_id: str | None = None,
        search: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[builtins.list[Ticket], str | None]:
        """One keyset page, newest first, and the cursor of the next (or None)."""
        data = self._request(
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

    def list(
        self,
        *,
        endpoint: str | None = None,
        state: str | None = None,
        trace_id: str | None = None,
        search: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Ticket]:
        """Every matching ticket, newest first, fetched a page at a time."""
        cursor: str | None = None
        while True:
            items, cursor = self.list_page(
                endpoint=endpoint,
                state=state,
                trace_id=trace_id,
                search=search,
                limit=page_size,
                cursor=cursor,
            )
            yield from items
            if not cursor:
                return

    def events(self, ticket_id: IdLike) -> builtins.list[Event]:
        return [Event.from_json(e) for e in self._request("GET", f"/tickets/{ticket_id}/events")]

    def stream(self, ticket_id: IdLike, last_event_id: int | None = None) -> Iterator[Step]:
        """The ticket's steps as they happen (``GET /tickets/{id}/stream``):
        each ledger event after ``last_event_id`` once, transient ``delta``
        steps, and a final ``end`` step once the ticket is terminal. A
        dropped connection, or the server ending a long stream, is resumed
        with ``Last-Event-ID`` (dropped connections count against
        ``retries`` until a step arrives); an error answer raises as the
        other calls do (``NotFound`` for a stranger's ticket)."""
        stream = _sse.Resume(self.policy, last_event_id)
        timeout = httpx.Timeout(self.timeout, read=_sse.READ_TIMEOUT_S)
        while True:
            try:
                with self._http.stream(
                    "GET",
                    f"/tickets/{ticket_id}/stream",
                    headers=stream.request(),
                    timeout=timeout,
                ) as response:
                    if not response.is_success:
                        response.read()
                        time.sleep(stream.on_response(response))
                        continue
                    for line in response.iter_lines():
                        if (step := stream.feed(line)) is not None:
                            yield step
                            if stream.done:
                                return
            except httpx.TransportError as exc:
                time.sleep(stream.on_transport_error(exc))
                continue
            time.sleep(stream.on_close())

    def lineage(self, ticket_id: IdLike) -> Lineage:
        return Lineage.from_json(self._request("GET", f"/tickets/{ticket_id}/lineage"))

    def cancel(self, ticket_id: IdLike) -> Ticket:
        """Cancel a queued or waiting ticket; a running one gets an interrupt
        request (its state changes when the turn stops)."""
        try:
            data = self._request("POST", f"/tickets/{ticket_id}/cancel")
        except ClaimcheckError as exc:
            if _common.already_done(exc, state="cancelled"):
                return self.get(ticket_id)
            raise
        return Ticket.from_json(data)

    def ack(self, ticket_id: IdLike) -> Ticket:
        """Acknowledge a pull delivery (the requester took the result)."""
        try:
            data = self._request("POST", f"/tickets/{ticket_id}/delivery/ack", json={})
        except ClaimcheckError as exc:
            if _common.already_done(exc, delivery="delivered"):
                return self.get(ticket_id)
            raise
        return Ticket.from_json(data)

    def retry(
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
            data = self._request("POST", f"/tickets/{ticket_id}/retry", json=body)
        except ClaimcheckError as exc:
            if exc.ambiguous and isinstance(exc, InvalidTransition):
                original = self.get(ticket_id)
                if original.retry:
                    return self.get(original.retry)
            raise
        return Ticket.from_json(data)

    def approve(self, ticket_id: IdLike) -> Ticket:
        """An owner releases a finished ticket's delivery (approving twice is a no-op)."""
        return Ticket.from_json(self._request("POST", f"/tickets/{ticket_id}/approve"))

    def turn(self, turn_id: IdLike) -> Turn:
        return Turn.from_json(self._request("GET", f"/turns/{turn_id}"))

    def wait(self, ticket_id: IdLike, timeout: float) -> Ticket:
        """Wait up to ``timeout`` seconds for the ticket to finish; returns it
        terminal, or as it is at the deadline (check ``is_terminal``).

        The server long-polls only on admission, so a ticket with a dedupe
        key is waited for by submitting it again, unchanged, with ``wait_s``
        (at most ``max_wait_s``, the server's cap): the dedupe key makes that
        a read of the same ticket that answers as soon as it is terminal. A
        ticket without a key, or a long poll the server refuses, is polled
        with ``GET`` and a growing pause instead.
        """
        deadline = time.monotonic() + timeout
        ticket = self.get(ticket_id)
        long_poll = ticket.dedupe_key is not None
        pause = 0.2
        while not ticket.is_terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if long_poll:
                wait_s, asked = min(left, self.max_wait_s), time.monotonic()
                try:
                    polled = self._long_poll(ticket, wait_s)
                except _common.LONG_POLL_GIVE_UP:
                    long_poll = False
                    continue
                if polled.id == ticket.id:
                    ticket = polled
                    if ticket.is_terminal or not _common.answered_early(asked, wait_s):
                        continue
                    # No wait slot was free on the server (or its wait met an
                    # outage): pause as a poll would, never a tight loop.
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(pause * 2, 5.0)
                    continue
                long_poll = False  # not the same ticket (cannot happen): never trust it
            time.sleep(min(pause, left))
            pause = min(pause * 2, 5.0)
            ticket = self.get(ticket_id)
        return dataclasses.replace(ticket, duplicate=False)

    def _long_poll(self, ticket: Ticket, wait_s: float) -> Ticket:
        body = _common.long_poll_body(ticket, wait_s)
        return Ticket.from_json(
            self._request("POST", "/tickets", json=body, timeout=self.timeout + wait_s)
        )
