"""`make run`'s migrate and seed steps in one Python process (scripts/run.py
starts it with the virtual environment's Python, before the servers: it
loads Django meanwhile, then waits for "go"): each `manage.py` start
loads Django, the apps and Celery again, the larger part of a restart's
time on a busy machine. Prints a line per step with its time, in the
supervisor's format."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} run    | {message}", flush=True)


def main() -> int:
    started = time.monotonic()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    say(f"django loaded in {time.monotonic() - started:.1f} s")
    # scripts/run.py says "go" once the servers answer; anything else, or
    # the end of the input, means the start was called off.
    if sys.stdin.readline().strip() != "go":
        return 0
    # --allow-production: a local `make run` is the demo (DEBUG stays off).
    steps = (
        ("migrate", ("migrate", "--no-input", "-v0")),
        ("seed", ("seed_demo", "--allow-production")),
    )
    for step, args in steps:
        started = time.monotonic()
        say(f"{step} ...")
        call_command(*args)
        say(f"{step} done in {time.monotonic() - started:.1f} s")
    connections.close_all()
    return 0


if __name__ == "__main__":
    code = main()
    # Nothing left to tidy: the interpreter's own teardown of Django, Celery
    # and their imports is slow on a busy machine.
    sys.stdout.flush()
    os._exit(code)
