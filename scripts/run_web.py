"""`make run`'s web process (scripts/run.py starts it with the virtual
environment's Python): gunicorn with the production configuration
(deploy/gunicorn.conf.py), sized by scripts/run.py's ``WEB_CONCURRENCY``
and ``GUNICORN_THREADS``. It loads Django, the apps and the URL conf while
the supervisor starts the servers and migrates, then serves once the
supervisor writes ``go`` on its standard input (its import, seconds on a
busy machine, is then off the way to the first page): the loaded
application is gunicorn's preloaded app, which its processes inherit.
Anything else on standard input, or its end, means the start was called
off: it exits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A stop (SIGTERM from scripts/run.py) lets requests in flight finish for
# this long, not the deployment's 20 s: a console watch or a wait_s would
# otherwise hold the stop past the supervisor's RUN_STOP_WAIT_S. Their
# clients ask again.
GRACEFUL_TIMEOUT_S = 3


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.urls import get_resolver
    from gunicorn.app.base import Application

    application = get_wsgi_application()
    get_resolver().url_patterns  # noqa: B018 - imports every app's views and the API now
    if sys.stdin.readline().strip() != "go":
        return 0

    class Web(Application):
        def init(self, parser, opts, args):
            return None

        def load_config(self):
            # The deployment's file, then what differs on a laptop; no
            # command line of gunicorn's (this script's argument is the bind).
            self.load_config_from_file(str(ROOT / "deploy" / "gunicorn.conf.py"))
            self.cfg.set("bind", [sys.argv[1]])
            self.cfg.set("preload_app", True)
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_S)
            self.cfg.set("proc_name", "claimcheck-web")

        def load(self):
            return application

    Web().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
