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
import time
from pathlib import Path

from claimcheck_client import TERMINAL_STATES, Client, NotFound

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
        # The callback that completes the root finishes its own ticket just
        # after: wait (briefly) until the whole trace is at rest.
        nodes = cc.lineage(done.id).nodes
        deadline = time.monotonic() + 10
        while any(n.state not in TERMINAL_STATES for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
            nodes = cc.lineage(done.id).nodes
        print_tree(nodes)
        return 0 if done.state == "succeeded" else 1


def print_tree(nodes) -> None:
    """The trace as a tree, each ticket under its parent. A child's answer
    comes home as a callback ticket on the asking endpoint, admitted as the
    child's own child: marked so, it does not read as a third sub-agent."""
    by_id = {n.id: n for n in nodes}
    children: dict[str | None, list] = {}
    for node in nodes:
        children.setdefault(node.parent if node.parent in by_id else None, []).append(node)

    def show(node, depth: int) -> None:
        parent = by_id.get(node.parent)
        grandparent = by_id.get(parent.parent) if parent else None
        home = grandparent is not None and grandparent.endpoint == node.endpoint
        note = f"  (callback for {parent.endpoint})" if home else ""
        print(f"  {'  ' * depth}{node.endpoint}: {node.state}{note}")
        for child in children.get(node.id, []):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


if __name__ == "__main__":
    sys.exit(main())
