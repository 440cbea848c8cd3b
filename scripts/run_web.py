"""`make run`'s web process (supervisord starts it, scripts/supervisord.conf):
gunicorn with the production configuration (deploy/gunicorn.conf.py), sized
by scripts/run.py's ``WEB_CONCURRENCY`` and ``GUNICORN_THREADS``. It loads
Django, the apps and the URL conf while the servers start and migrate runs,
then serves once the file named by its second argument exists
(scripts/run_start.py creates it after the seed; started again later, it
finds it at once): the loaded application is gunicorn's preloaded app,
which its processes inherit, so its import, seconds on a busy machine, is
off the way to the first page."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A stop (SIGTERM from supervisord) lets requests in flight finish for
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
    go = Path(sys.argv[2])
    while not go.exists():  # a stop before it is SIGTERM, which ends this wait
        time.sleep(0.05)

    class Web(Application):
        def init(self, parser, opts, args):
            return None

        def load_config(self):
            # The deployment's file, then what differs on a laptop; no
            # command line of gunicorn's (this script's first argument is the bind).
            self.load_config_from_file(str(ROOT / "deploy" / "gunicorn.conf.py"))
            self.cfg.set("bind", [sys.argv[1]])
            self.cfg.set("preload_app", True)
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_S)
            self.cfg.set("proc_name", "claimcheck-web")

        def load(self):
            return application

    try:
        Web().run()
    except SystemExit as stop:  # gunicorn's master, stopped
        return stop.code if isinstance(stop.code, int) else 1
    return 0


if __name__ == "__main__":
    code = main()
    # Nothing left to tidy once gunicorn's master has stopped its workers:
    # the interpreter's own teardown of Django and its imports would take
    # seconds of the supervisor's stop wait on a busy machine.
    sys.stdout.flush()
    os._exit(code)
