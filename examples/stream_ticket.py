"""Submit a prompt to ``make run``'s offline demo agent and print its steps
as they happen (``GET /api/v1/tickets/{id}/stream``, docs/howto/streaming.md).

    make run   # in another shell: web, workers, the demo key in var/demo_api_key
    .venv/bin/python examples/stream_ticket.py "slow 2"
    .venv/bin/python examples/stream_ticket.py "delegate a, b"

Uses only the Python client (``claimcheck_client``): the stream resumes by
itself with ``Last-Event-ID`` when its connection drops or the server ends
it after ``STREAM_MAX_S``. ``CLAIMCHECK_URL`` and ``CLAIMCHECK_KEY``
override the demo's address and key.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from claimcheck_client import Client

ROOT = Path(__file__).resolve().parent.parent


def describe(kind: str, data: dict) -> str:
    """One line for a ledger event."""
    detail = data["detail"]
    if kind == "tool_started":
        return f"{detail['tool']}({detail.get('args', '...')})"
    if kind == "tool_ended":
        return f"{detail['tool']} {detail['status']} in {detail['duration_ms']} ms"
    if kind == "agent_usage":
        return f"{detail.get('input_tokens')} tokens in, {detail.get('output_tokens')} out"
    return f"{data['from_state'] or '-'} -> {data['to_state'] or '-'}"


def main() -> None:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "slow 2"
    url = os.environ.get("CLAIMCHECK_URL", "http://127.0.0.1:8000")
    key = os.environ.get("CLAIMCHECK_KEY") or (ROOT / "var" / "demo_api_key").read_text().strip()
    with Client(url, key) as cc:
        ticket = cc.submit("demo.agent", {"prompt": prompt})
        print(f"ticket {ticket.id} ({ticket.state})")
        for step in cc.stream(ticket.id):
            if step.is_end:
                print(f"end: {step.data['state']}")
                break
            if step.kind == "delta":
                print(step.data.get("text", ""), end="", flush=True)
                continue
            print(f"#{step.id} {step.kind}: {describe(step.kind, step.data)}")
        print("result:", cc.get(ticket.id).result)


if __name__ == "__main__":
    main()
