"""Run an example research agent end to end, in this process (the worker's
code path: start, a forked turn, finish, children, callbacks), against the
database in ``DATABASE_URL``.

    DATABASE_URL=postgres://... .venv/bin/python examples/run_research.py \
        [pydantic_ai|openai_agents] "topic"

Offline by default. With a real model: ``EXAMPLE_MODEL=openai:gpt-4o-mini``
(Pydantic AI) or ``EXAMPLE_MODEL=gpt-4o-mini`` (Agents SDK), and the key
held as the named secret ``EXAMPLE_OPENAI_KEY`` (``RUNNER_SECRETS_FILE``, or
the environment with ``RUNNER_SECRET_NAMES=EXAMPLE_OPENAI_KEY``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

PREFIX = {"pydantic_ai": "pai", "openai_agents": "oai"}
MODULE = {"pydantic_ai": "research_pydantic_ai", "openai_agents": "research_openai_agents"}


def main() -> None:
    framework = sys.argv[1] if len(sys.argv) > 1 else "pydantic_ai"
    topic = sys.argv[2] if len(sys.argv) > 2 else "durable agent runtimes"
    django.setup()
    from django.conf import settings

    from endpoints.models import Endpoint
    from endpoints.services import create_endpoint
    from runtime import turns
    from tickets.admission import admit_ticket
    from tickets.models import Ticket

    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = [
        *settings.RUNNER_PYTHON_ALLOWED_PREFIXES,
        "examples.",
    ]
    secrets = {"OPENAI_API_KEY": "EXAMPLE_OPENAI_KEY"} if os.environ.get("EXAMPLE_MODEL") else {}
    prefix, module = PREFIX[framework], MODULE[framework]
    for role in ("research", "search", "summarize"):
        address = f"examples.{prefix}-{role}"
        factory = {"research": "researcher", "search": "searcher", "summarize": "summarizer"}[role]
        if not Endpoint.objects.filter(address=address).exists():
            runner = {
                "kind": "agent",
                "framework": framework,
                "path": f"examples.{module}.{factory}",
            }
            if secrets:
                runner["secrets"] = secrets
            create_endpoint(address=address, runner=runner, actor="examples")
    root = admit_ticket(endpoint=f"examples.{prefix}-research", input={"prompt": topic}).ticket
    # Run whatever is queued until the root is done: the root's turn, its
    # two children, their callbacks (a worker does this from the broker).
    for _ in range(20):
        root.refresh_from_db()
        if root.state in ("succeeded", "failed", "cancelled"):
            break
        queued = Ticket.objects.filter(trace_id=root.trace_id, state="queued").order_by("id")
        for ticket in queued:
            turns.run_ticket(ticket_id=ticket.id)
    print(f"{root.state}: {root.result if root.state == 'succeeded' else root.error}")


if __name__ == "__main__":
    main()
