"""Run an example research agent end to end on a running stack (`make run`,
whose ``seed_demo`` creates the examples' endpoints and whose workers'
allow-list takes ``examples.``): submit the researcher's ticket with the
Python client, wait for it, print its brief and its trace.

    .venv/bin/python examples/run_research.py [pydantic_ai|openai_agents|langgraph] ["topic"]

The server and key: ``CLAIMCHECK_URL`` (default ``http://127.0.0.1:$PORT``,
``PORT`` 8000) and ``CLAIMCHECK_KEY`` (default the demo key `make run`
keeps in ``var/demo_api_key``).

Offline by default. With a real model: ``EXAMPLE_MODEL=openai:gpt-4o-mini``
(Pydantic AI) or ``EXAMPLE_MODEL=gpt-4o-mini`` (Agents SDK) in the workers'
environment, and the key held there as the named secret
``EXAMPLE_OPENAI_KEY`` (examples/README.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from claimcheck_client import Client, NotFound

ROOT = Path(__file__).resolve().parent.parent
PREFIX = {"pydantic_ai": "pai", "openai_agents": "oai", "langgraph": "lg"}


def main() -> int:
    framework = sys.argv[1] if len(sys.argv) > 1 else "pydantic_ai"
    topic = sys.argv[2] if len(sys.argv) > 2 else "durable agent runtimes"
    if framework not in PREFIX:
        print(f"framework is one of {', '.join(PREFIX)}, not {framework!r}", file=sys.stderr)
        return 2
    url = os.environ.get("CLAIMCHECK_URL") or f"http://127.0.0.1:{os.environ.get('PORT', '8000')}"
    key = os.environ.get("CLAIMCHECK_KEY", "")
    if not key:
        var = Path(os.environ.get("CLAIMCHECK_VAR_DIR") or ROOT / "var")
        try:
            key = (var / "demo_api_key").read_text().strip()
        except OSError:
            print(
                f"no CLAIMCHECK_KEY and no {var / 'demo_api_key'}: start `make run` first",
                file=sys.stderr,
            )
            return 2
    address = f"examples.{PREFIX[framework]}-research"
    with Client(url, key) as cc:
        try:
            ticket = cc.submit(address, {"prompt": topic})
        except NotFound:
            print(
                f"{address} does not exist: `make run` seeds it when {framework} is installed "
                "(make run EXTRAS=...; see its 'examples for' line)",
                file=sys.stderr,
            )
            return 1
        done = cc.wait(ticket.id, timeout=120)
        print(f"{done.state}: {done.result if done.state == 'succeeded' else done.error}")
        for node in cc.lineage(done.id).nodes:
            print(f"  {'  ' * node.depth}{node.endpoint}: {node.state}")
        return 0 if done.state == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
