"""The agent runner's overhead per turn, against a python callable doing the
same, measured in the same run.

    .venv/bin/python bench/agents.py [-n 40] [--reps 3]

Three endpoints, each process-isolated (the slot's warm turn process, as on a worker):

- python: ``bench.agent_parts.remember``, a callable that reads the
  endpoint's history and answers like demo.agent's ``remember``;
- pydantic_ai: demo.agent (runner kind ``agent``, a Pydantic AI agent on a
  ``FunctionModel``): history loaded from its artifacts, one model request,
  its messages stored as an artifact;
- openai_agents: the same on the OpenAI Agents SDK with a local fake Model
  (tests/agents/openai_agent.py).

Each rep runs N tickets per endpoint through ``turns.run_ticket`` in this
process (the worker's code path without the broker: start, fork, run,
finish), one endpoint after the other, the order rotating between reps. A
figure is the median per-turn time over reps; the overhead is agent minus
python. The frameworks are preloaded first (``AGENT_PRELOAD``'s work), so
the figures are warm turns. Uses its own scratch database
``claimcheck_bench_agents``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import benchlib  # noqa: E402

RUNNERS = {
    "python": {"kind": "python", "path": "bench.agent_parts.remember"},
    "pydantic_ai": {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"},
    "openai_agents": {
        "kind": "agent",
        "framework": "openai_agents",
        "path": "tests.agents.openai_agent.build",
    },
}


def one_round(name: str, n: int, rep: int) -> float:
    """Seconds per turn for N tickets on one endpoint."""
    from runtime import turns
    from tickets.admission import admit_ticket
    from tickets.models import Ticket

    began = time.perf_counter()
    for i in range(n):
        ticket = admit_ticket(
            endpoint=f"bench.agent-{name}", input={"prompt": f"remember {rep}-{i}"}
        ).ticket
        turns.run_ticket(ticket_id=ticket.id)
        state = Ticket.objects.values_list("state", flat=True).get(id=ticket.id)
        assert state == "succeeded", (name, state)
    return (time.perf_counter() - began) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="turns per endpoint per rep")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    benchlib.use_database("claimcheck_bench_agents")
    benchlib.start_wall_clock()
    benchlib.recreate_database()
    benchlib.setup_django()

    from django.conf import settings

    from endpoints.services import create_endpoint
    from runtime.agents.runner import preload

    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["runtime.demo.", "bench.", "tests."]
    for name, runner in RUNNERS.items():
        create_endpoint(address=f"bench.agent-{name}", runner=runner)
        if runner["kind"] == "agent":
            preload(runner)
    names = list(RUNNERS)
    per_turn: dict[str, list[float]] = {name: [] for name in names}
    try:
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                per_turn[name].append(one_round(name, args.n, rep))
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            benchlib.drop_database()
    python = statistics.median(per_turn["python"])
    print(f"turns: {args.n} per endpoint per rep, {args.reps} reps (median per turn)")
    for name in names:
        ms = statistics.median(per_turn[name]) * 1000
        extra = "" if name == "python" else f"  overhead {ms - python * 1000:+.1f} ms"
        print(f"  {name:14s} {ms:7.1f} ms/turn  ratio {ms / (python * 1000):.2f}{extra}")


if __name__ == "__main__":
    main()
