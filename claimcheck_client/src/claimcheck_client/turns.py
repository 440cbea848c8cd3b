"""The agent side of the turn API, for an endpoint with an ``http`` runner.

The runtime POSTs the turn envelope to the agent; an agent that answers
later (202) heartbeats and posts its result through ``/turns/{id}/...`` with
the turn's ``seq`` (its fencing token) and the credential issued to that
turn. Only the exact current turn may answer: anything else is 409
``stale_turn`` and changes nothing on the server.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from . import _common
from ._retry import Attempts, RetryPolicy
from .errors import ClaimcheckError, StaleTurn
from .models import Turn, parse_time

_UNSET: Any = object()


class TurnAgent:
    """Answer one turn.

    >>> agent = TurnAgent("http://127.0.0.1:8000", envelope)
    >>> agent.heartbeat()          # at least every heartbeat_timeout_s
    >>> if agent.interrupt_requested: agent.stopped("asked to stop")
    >>> agent.result({"answer": 42})   # or agent.result(error={...})

    The credential is the one handed to this turn in the envelope
    (``envelope["turn"]["token"]``), sent as ``Authorization: Bearer``;
    ``token=`` is used when the envelope carries none.
    """

    def __init__(
        self,
        base_url: str,
        turn_envelope: Mapping[str, Any],
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        turn = turn_envelope["turn"]
        self.turn_id: str = str(turn["id"])
        self.seq: int = int(turn["seq"])
        self.deadline_at: datetime | None = parse_time(turn.get("deadline_at"))
        ticket = turn_envelope.get("ticket") or {}
        self.ticket_id: str | None = ticket.get("id")
        self.input: dict[str, Any] = ticket.get("input") or {}
        credential = turn.get("token") or token
        if not credential:
            raise ValueError("the envelope has no turn token and no token= was given")
        self.interrupt_requested = False
        self.policy = RetryPolicy(retries=retries)
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=_common.api_root(base_url),
            headers=_common.headers(credential),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> TurnAgent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> Turn:
        attempts = Attempts(self.policy)
        while True:
            try:
                response = self._http.request(method, path, json=body)
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
            return Turn.from_json(attempts.finish(response).json())

    def _finish(self, action: str, body: dict[str, Any], ended: str) -> Turn:
        """Post a result or stop receipt. If an earlier attempt's answer was
        lost, a 409 ``stale_turn`` may mean that attempt was accepted (the
        turn is no longer running): the turn's own state tells."""
        try:
            return self._send("POST", f"/turns/{self.turn_id}/{action}", body)
        except StaleTurn as exc:
            if not exc.ambiguous:
                raise
            try:
                turn = self._send("GET", f"/turns/{self.turn_id}")
            except ClaimcheckError:
                raise exc from None
            if turn.seq == self.seq and turn.state == ended:
                return turn
            raise

    def heartbeat(self) -> Turn:
        """Tell the runtime the turn is alive; sets ``interrupt_requested``
        when the runtime asks the agent to stop (budget or cancel)."""
        turn = self._send("POST", f"/turns/{self.turn_id}/heartbeat", {"seq": self.seq})
        self.interrupt_requested = turn.interrupt_requested
        return turn

    def result(
        self,
        value: Any = _UNSET,
        *,
        error: Any = None,
        artifacts: list[dict[str, Any]] | None = None,
    ) -> Turn:
        """Finish the turn with ``value`` (the ticket's result) or, with
        ``error=``, as a failure."""
        if error is not None:
            if value is not _UNSET:
                raise ValueError("give a result value or error=, not both")
            return self._finish("result", {"seq": self.seq, "error": error}, "failed")
        body: dict[str, Any] = {"seq": self.seq, "result": None if value is _UNSET else value}
        if artifacts:
            body["artifacts"] = artifacts
        return self._finish("result", body, "completed")

    def stopped(self, detail: Any = None) -> Turn:
        """The stop receipt after an interrupt: the evidence that this turn ended."""
        return self._finish("stopped", {"seq": self.seq, "detail": detail}, "stopped")
