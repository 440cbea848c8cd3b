"""``manage.py serve_metrics [--bind ADDR] [--port N] [--ledger]``: serve this
host's Prometheus metrics (PROMETHEUS_MULTIPROC_DIR: every Celery process of
the host) over plain HTTP, for worker-only hosts. Web hosts already answer
on ``/metrics``. Bind it to a private interface (it has no authentication:
the port's firewall is the allow-list).

prometheus-client's own WSGI app answers (content negotiation, compression,
``name[]`` filters); wsgiref's single-threaded server runs it in this
process's main thread, so that the ledger gauges' queries reuse one
database connection instead of opening one per scrape thread."""

from __future__ import annotations

from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.core.management.base import BaseCommand, CommandError
from prometheus_client import make_wsgi_app

from config import metrics


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # one line per scrape is noise
        pass


class Command(BaseCommand):
    help = "Serve this host's worker metrics (PROMETHEUS_MULTIPROC_DIR) for Prometheus."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=9808)
        parser.add_argument(
            "--ledger",
            action="store_true",
            help="also the database gauges (queued tickets, open cases...): one host is enough",
        )

    def handle(self, *args, bind, port, ledger, **options):
        if not metrics.multiprocess_dir():
            raise CommandError("set PROMETHEUS_MULTIPROC_DIR (the directory the workers write)")
        app = make_wsgi_app(metrics.host_registry(ledger=ledger))
        with make_server(bind, port, app, handler_class=_Quiet) as server:
            self.stdout.write(
                f"serving {metrics.multiprocess_dir()} on http://{bind}:{port}/metrics"
            )
            server.serve_forever()
