"""`make run`'s web process (scripts/run.py starts it with the virtual
environment's Python): it loads Django, the apps and the URL conf while the
supervisor starts the servers and migrates, then serves once the supervisor
writes ``go`` on its standard input (its import, seconds on a busy
machine, is then off the way to the first page). Anything else on standard
input, or its end, means the start was called off: it exits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every app's views and the API now
    if sys.stdin.readline().strip() != "go":
        return 0
    # --skip-checks: `make test` runs them; here they cost seconds a start.
    call_command("runserver", sys.argv[1], use_reloader=False, skip_checks=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
