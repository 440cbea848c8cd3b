"""AsyncClient: the same calls and retries as Client, on asyncio."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from claimcheck_client import AsyncClient, NotFound

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_async_submit_retry_wait_list_and_errors(worker, server, api_key, endpoint, proxy, ledger):
    endpoint("a-echo")
    p = proxy(["drop"])

    async def scenario():
        async with AsyncClient(p.url, api_key, backoff_base=0.05) as flaky:
            first = await flaky.submit("a-echo", {"n": 1})
        async with AsyncClient(server, api_key) as cc:
            done = await cc.wait(first.id, timeout=30)
            listed = [t.id async for t in cc.list(endpoint="a-echo", page_size=1)]
            with pytest.raises(NotFound):
                await cc.get(uuid.uuid4())
            events = await cc.events(first.id)
        return first, done, listed, events

    first, done, listed, events = asyncio.run(scenario())
    assert first.duplicate is True  # the dropped first attempt had created it
    assert [s.action for s in p.seen] == ["drop", "forward"]
    assert (done.state, done.result) == ("succeeded", {"echo": {"n": 1}})
    assert listed == [first.id]
    assert [e.kind for e in events][0] == "admitted"
    assert len(ledger.tickets(endpoint__address="a-echo")) == 1
