"""``_sse.Resume``, the one reconnect logic of ``Client.stream`` and
``AsyncClient.stream``, without a server: what each connection asks for,
when a retry budget starts again, how long a resume waits, and which error
ends the call. The clients' streams against the real app are in
test_stream.py."""

from __future__ import annotations

import httpx
import pytest
from claimcheck_client._retry import RetryPolicy
from claimcheck_client._sse import QUICK_END_S, Resume

from claimcheck_client import NotFound, TransportError, Unavailable

POLICY = RetryPolicy(retries=2, backoff_base=1.0, backoff_cap=100.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _answer(status: int, body: dict | None = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body or {}, headers=headers)


def test_each_connection_asks_from_the_last_ledger_event_and_end_finishes_the_call():
    stream = Resume(POLICY, last_event_id=3)
    assert stream.request() == {"Accept": "text/event-stream", "Last-Event-ID": "3"}
    lines = ["id: 4", "event: tool_started", "data: {}", "", "event: delta", "data: {}", ""]
    steps = [s for s in map(stream.feed, lines) if s is not None]
    assert [(s.kind, s.id) for s in steps] == [("tool_started", 4), ("delta", None)]
    assert stream.request()["Last-Event-ID"] == "4"  # a delta has no id: still 4
    assert not stream.done
    stream.feed("event: end")
    stream.feed('data: {"state": "succeeded"}')
    assert stream.feed("").is_end and stream.done


def test_a_half_read_message_is_not_carried_into_the_next_connection():
    stream = Resume(POLICY)
    assert "Last-Event-ID" not in stream.request()
    stream.feed("id: 9")
    stream.feed("data: {}")  # the connection drops before the blank line
    stream.request()
    assert stream.feed("") is None
    assert "Last-Event-ID" not in stream.request()


def test_a_stream_that_ends_at_once_with_nothing_backs_off_more_each_time():
    clock = Clock()
    stream = Resume(RetryPolicy(backoff_base=1.0, backoff_cap=0.0), clock=clock)
    stream.request()
    clock.now += QUICK_END_S / 2
    stream.on_close()
    stream.request()
    stream.on_close()
    assert stream.quiet == 2  # the backoff's exponent
    stream.request()
    clock.now += QUICK_END_S  # a long stream, even with nothing: resumed at once
    assert stream.on_close() == 0.0 and stream.quiet == 0
    stream.request()
    for line in ("event: delta", "data: {}", ""):
        stream.feed(line)
    assert stream.on_close() == 0.0 and stream.quiet == 0  # a step came: at once


def test_dropped_connections_are_retried_until_the_budget_then_raise():
    stream = Resume(POLICY)
    drop = httpx.ReadError("gone")
    assert stream.on_transport_error(drop) >= 0
    assert stream.on_transport_error(drop) >= 0
    with pytest.raises(TransportError) as raised:
        stream.on_transport_error(drop)
    assert raised.value.ambiguous and raised.value.__cause__ is drop


def test_a_step_gives_the_retries_back():
    stream = Resume(POLICY)
    stream.on_transport_error(httpx.ConnectError("refused"))
    stream.on_transport_error(httpx.ConnectError("refused"))
    stream.request()
    for line in ("event: delta", "data: {}", ""):
        stream.feed(line)
    assert stream.on_transport_error(httpx.ConnectError("refused")) >= 0  # not raised


def test_an_error_answer_is_retried_when_it_says_so_and_raised_typed_otherwise():
    stream = Resume(POLICY)
    busy = _answer(503, {"error": "unavailable", "detail": "briefly"}, **{"Retry-After": "2"})
    assert 2 <= stream.on_response(busy) <= 2.2
    assert 2 <= stream.on_response(busy) <= 2.2
    with pytest.raises(Unavailable):
        stream.on_response(busy)
    with pytest.raises(NotFound):
        Resume(POLICY).on_response(_answer(404, {"error": "not_found", "detail": "no ticket"}))
